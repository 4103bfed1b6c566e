"""A checkpoint file's bytes copied once into memory that only this process holds, checksummed
on the way: what every verified load (restore, ``load_checkpoint``, the evaluator) reads from.

Why not map the checkpoint file itself (what restores did until issue 21): a file truncated while
it is mapped — by another process, a clean-up, a hostile user — ends the process with SIGBUS the
moment a tensor's page past the new end is touched. A read that comes up short is an error
instead. And why not read it into ordinary buffers: ``torch.load`` then copies every record once
more into its tensor (two copies, twice the memory).

So `read_private_copy` copies the open file into an anonymous memory file (``memfd_create``),
sealed against shrinking and growing (``F_SEAL_*``: nobody, not even another process opening
``/proc/<pid>/fd/<n>``, can truncate it, so mapping it can never raise SIGBUS), on parallel
threads that compute the CRC-32 of each chunk as it passes; a truncation of the checkpoint file
meanwhile is a short read (`CheckpointCorruptError`). Then it seals the copy against writes (the
verified bytes cannot change). ``torch.load(
copy.path, mmap=True)`` then maps the sealed copy: the tensors are views of it, with no further
copy. Bytes read from the checkpoint file: its size (1.0×); memory: the file's size.

Where ``memfd_create`` or ``/proc/self/fd`` is missing (not Linux), the file is read into a ``bytearray`` with its CRC computed chunk by chunk, and
``torch.load`` reads it through `MemoryFile` (one more copy into the tensors).

Either way the size is checked against the memory available first (``MemAvailable``): a sparse
file whose manifest claims a terabyte is refused as damage, never a ``MemoryError`` or the OOM
killer.
"""
from __future__ import annotations

import errno
import io
import logging
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from supervisor.checkpoint.storage.fileio import available_memory_bytes, crc32, crc32_combine
from supervisor.checkpoint.formats.memory_file import MemoryFile
from supervisor.checkpoint.storage.base import PreconditionFailedError
from supervisor.errors import CheckpointCorruptError

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["MEMORY_FILES", "MemoryFile", "PrivateCopy", "available_memory_bytes", "checksum_stream", "copy_file",
           "read_private_copy", "seal_memory_file"]

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 8 << 20
_COPY_CHUNK_BYTES = 1 << 20  # stays in the CPU cache between read, CRC and write
_PARALLEL_MIN_BYTES = 16 << 20  # per CRC thread
_MEMFD = hasattr(os, "memfd_create") and hasattr(os, "sendfile") and os.path.isdir("/proc/self/fd")
MEMORY_FILES = _MEMFD  # whether private copies are sealed memory files here (else bytearrays)
_RANGED_PARALLEL = 8  # ranged requests in flight per object-store file: latency, not CPU, bounds them
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE", "F_SEAL_SEAL")


class PrivateCopy:
    """One file's bytes in private memory: a sealed memory file (`path` names it for
    ``torch.load(mmap=True)``) or, as the fallback, a ``bytearray`` (`open` reads it)."""

    def __init__(self, size: int, crc: int | None, *, memfd: int | None = None, data: bytearray | None = None):
        self.size, self.crc = size, crc
        self._memfd, self._data = memfd, data

    @property
    def path(self) -> str | None:
        """A path this process can open (and map) the copy by, or None for the in-memory fallback."""
        return None if self._memfd is None else f"/proc/self/fd/{self._memfd}"

    @property
    def data(self) -> bytearray | None:
        """The bytes, for the ``bytearray`` form; None for a memory file."""
        return self._data

    def head(self, n: int) -> bytes:
        if self._memfd is not None:
            return os.pread(self._memfd, n, 0)
        return bytes(memoryview(self._data or b"")[:n])

    def open(self, name: str) -> io.RawIOBase:
        """A seekable binary file over the copy, printing as ``name``."""
        if self._memfd is not None:
            return io.FileIO(self.path or "", "rb")
        return MemoryFile(self._data if self._data is not None else bytearray(), name)

    def close(self) -> None:
        """Releases the copy (tensors already mapped from it keep their pages)."""
        if self._memfd is not None:
            os.close(self._memfd)
            self._memfd = None
        self._data = None

    def __enter__(self) -> PrivateCopy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_private_copy(fd: int, size: int, where: str, *, checksum: bool = True,
                      in_buffer: bool = False) -> PrivateCopy:
    """Copies ``size`` bytes of the open file ``fd`` into private memory (module docstring),
    with their CRC-32 (``copy.crc``; None without ``checksum``). ``where`` names the file in
    errors ("<checkpoint>: state.pt"). ``in_buffer`` asks for the ``bytearray`` form
    (``copy.data``), for readers that want bytes rather than a file to map.

    Raises:
        CheckpointCorruptError: the file ends before ``size`` bytes (truncated meanwhile), cannot
            be read, or ``size`` does not fit in the available memory.
    """
    check_fits(size, where)
    if _MEMFD and size > 0 and not in_buffer:
        return _memfd_copy(fd, size, where, checksum)
    return _buffer_copy(fd, size, where, checksum)


def copy_file(file: Any, size: int, where: str, *, checksum: bool = True, in_buffer: bool = False) -> PrivateCopy:
    """`read_private_copy` of an open binary reader of a `Snapshot` (``Storage.open_snapshot``):
    a local file (``io.FileIO``) by its descriptor, on parallel threads; an object store's reader
    by ranges on parallel threads (`_ranged_read`: with ``read_into``, a few large ranges each
    streamed straight into the copy; with ``read_at`` only, `_CHUNK_BYTES` ranges); any other
    reader in order. The same kinds of copy either way, the CRC-32 computed on the way.
    Bytes read: ``size``, once."""
    if isinstance(file, io.FileIO):
        return read_private_copy(file.fileno(), size, where, checksum=checksum, in_buffer=in_buffer)
    if hasattr(file, "read_at"):
        return _ranged_copy(file, size, where, checksum=checksum, in_buffer=in_buffer)
    check_fits(size, where)
    memfd = None
    if _MEMFD and size > 0 and not in_buffer:
        memfd = os.memfd_create("supervisor-checkpoint", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    try:
        if memfd is not None:
            os.ftruncate(memfd, size)
            seal_memory_file(memfd, "F_SEAL_SHRINK", "F_SEAL_GROW")
        target = bytearray(min(size, _CHUNK_BYTES)) if memfd is not None else _allocate(size, where)
        crc = _stream_into(file, target, memfd, size, where, checksum)
        if memfd is None:
            return PrivateCopy(size, crc if checksum else None, data=target)
        seal_memory_file(memfd, "F_SEAL_WRITE", "F_SEAL_SEAL")
        return PrivateCopy(size, crc if checksum else None, memfd=memfd)
    except BaseException:
        if memfd is not None:
            os.close(memfd)
        raise


def _stream_into(file: Any, target: bytearray, memfd: int | None, size: int, where: str, checksum: bool) -> int:
    """Reads ``size`` bytes of ``file`` in order: into ``target`` whole, or through ``target``
    (one chunk) into ``memfd``; returns their CRC-32."""
    crc, done = 0, 0
    view = memoryview(target)
    try:
        while done < size:
            chunk = view[:min(len(view), size - done)] if memfd is not None else view[done:done + _CHUNK_BYTES]
            try:
                n = file.readinto(chunk)
                if memfd is not None and n and os.pwrite(memfd, chunk[:n], done) != n:
                    raise OSError(errno.EIO, "short write into a memory file")
            except OSError as e:
                if isinstance(e, (FileNotFoundError, PreconditionFailedError)):
                    raise  # the object was deleted or replaced meanwhile: the caller decides
                raise CheckpointCorruptError(f"{where} cannot be read ({e})") from e
            if not n:
                raise CheckpointCorruptError(f"{where} ended after {done} of {size} bytes (truncated while "
                                             "being read)")
            if checksum:
                crc = crc32(chunk[:n], crc)
            done += n
    finally:
        view.release()
    return crc


def _ranged_copy(file: Any, size: int, where: str, *, checksum: bool, in_buffer: bool) -> PrivateCopy:
    """`copy_file` of a reader with ``read_at(start, length)`` (an object store's: one ranged
    request each), several ranges in flight at once, each written straight into the copy (a
    map of the memory file, or the ``bytearray``) as it arrives when the reader can
    (``read_into``)."""
    check_fits(size, where)
    if not (_MEMFD and size > 0 and not in_buffer):
        buffer = _allocate(size, where)
        with memoryview(buffer) as view:
            crc = _ranged_read(file, size, where, view)
        return PrivateCopy(size, crc if checksum else None, data=buffer)
    memfd = os.memfd_create("supervisor-checkpoint", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    try:
        os.ftruncate(memfd, size)
        seal_memory_file(memfd, "F_SEAL_SHRINK", "F_SEAL_GROW")
        mapped = mmap.mmap(memfd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        try:
            with memoryview(mapped) as view:
                crc = _ranged_read(file, size, where, view)
        finally:
            _unmap(mapped)
        seal_memory_file(memfd, "F_SEAL_WRITE", "F_SEAL_SEAL")  # no writable map is left
        return PrivateCopy(size, crc if checksum else None, memfd=memfd)
    except BaseException:
        os.close(memfd)
        raise


def _unmap(mapped: mmap.mmap) -> None:
    """Unmaps ``mapped``; where a failed read's traceback still holds a view of it, the garbage
    collector unmaps it later (the copy is discarded anyway): the read's error is what counts."""
    try:
        mapped.close()
    except BufferError:
        logger.debug("a view of a discarded private copy outlives its read; unmapped when collected")


def _ranged_read(file: Any, size: int, where: str, target: memoryview | None) -> int:
    """Reads ``size`` bytes of ``file`` by ranges on parallel threads into ``target`` (or
    nowhere) and returns their CRC-32 (the ranges' CRCs combined). A reader with ``read_into``
    (`supervisor.checkpoint.storage.s3.objects.ObjectReader`) is read into ``target`` by its own ranges
    (``range_bytes``, ``parallelism`` in flight), the CRC computed on each piece as it arrives;
    any other by `_CHUNK_BYTES` ``read_at`` requests, `_RANGED_PARALLEL` in flight."""
    streamed = target is not None and hasattr(file, "read_into")
    span = file.range_bytes() if streamed else _CHUNK_BYTES
    starts = list(range(0, size, span))

    def chunk(start: int) -> tuple[int, int]:
        wanted = min(span, size - start)
        crc = [0]
        try:
            if streamed:
                got = file.read_into(start, target[start:start + wanted],  # type: ignore[index]
                                     lambda piece: crc.__setitem__(0, crc32(piece, crc[0])))
            else:
                data = file.read_at(start, wanted)
                got = len(data)
                if target is not None:
                    target[start:start + got] = data
                crc[0] = crc32(data)
        except (FileNotFoundError, PreconditionFailedError):
            raise
        except OSError as e:
            raise CheckpointCorruptError(f"{where} cannot be read ({e})") from e
        if got != wanted:
            raise CheckpointCorruptError(f"{where} ended after {start + got} of {size} bytes (truncated "
                                         "while being read)")
        return crc[0], got

    if len(starts) <= 1:
        return chunk(0)[0] if starts else 0
    parallel = file.parallelism if streamed else _RANGED_PARALLEL
    crc = 0
    with ThreadPoolExecutor(min(parallel, len(starts)), thread_name_prefix="supervisor-read") as pool:
        for part, length in pool.map(chunk, starts):
            crc = crc32_combine(crc, part, length)
    return crc


def checksum_stream(file: Any, size: int, where: str) -> int:
    """The CRC-32 of ``size`` bytes of an open binary reader, read once and kept nowhere
    (verification without loading; by parallel ranges when it has ``read_at``). Raises as
    `copy_file`."""
    if hasattr(file, "read_at"):
        return _ranged_read(file, size, where, None)
    buffer = bytearray(min(size, _CHUNK_BYTES))
    crc, done = 0, 0
    with memoryview(buffer) as view:
        while done < size:
            chunk = view[:min(len(view), size - done)]
            try:
                n = file.readinto(chunk)
            except (FileNotFoundError, PreconditionFailedError):
                raise
            except OSError as e:
                raise CheckpointCorruptError(f"{where} cannot be read ({e})") from e
            if not n:
                raise CheckpointCorruptError(f"{where} ended after {done} of {size} bytes (truncated while "
                                             "being read)")
            crc = crc32(chunk[:n], crc)
            done += n
    return crc


def _allocate(size: int, where: str) -> bytearray:
    try:
        return bytearray(size)
    except MemoryError:
        raise CheckpointCorruptError(f"{where} has {size} bytes, more than the memory available to read it "
                                     "into (a sparse or damaged file, or a checkpoint too large to read on this "
                                     "machine)") from None


def _memfd_copy(fd: int, size: int, where: str, checksum: bool) -> PrivateCopy:
    flags = os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0)
    memfd = os.memfd_create("supervisor-checkpoint", flags)
    try:
        os.ftruncate(memfd, size)
        seal_memory_file(memfd, "F_SEAL_SHRINK", "F_SEAL_GROW")
        crc = _copy_ranges(fd, memfd, size, where, checksum)
        seal_memory_file(memfd, "F_SEAL_WRITE", "F_SEAL_SEAL")
        return PrivateCopy(size, crc if checksum else None, memfd=memfd)
    except BaseException:
        os.close(memfd)
        raise


def seal_memory_file(memfd: int, *names: str) -> None:
    """Adds the seals ``names`` (``"F_SEAL_WRITE"``, ...) to a memory file, where it can."""
    if fcntl is None or not hasattr(fcntl, "F_ADD_SEALS"):
        return
    seals = 0
    for name in names:
        seals |= getattr(fcntl, name, 0)
    try:
        fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, seals)
    except OSError as e:  # no sealing here: the memory file is still ours alone, by its descriptor
        logger.debug("cannot seal a memory file (%s)", e)


def _copy_ranges(fd: int, memfd: int, size: int, where: str, checksum: bool) -> int:
    """Copies ``fd`` into ``memfd`` on parallel threads, each reading a range through a small
    buffer of its own (``pread``, CRC-32 while it is in the CPU cache, ``pwrite``: all release
    the GIL); returns the combined CRC-32. Measured on the project's 2-core VM, 256 MiB from the
    page cache: 0.17-0.35 s, against 0.24-0.27 s for ``sendfile`` plus 0.15-0.19 s for a CRC
    pass over a map of the copy (a fresh page of memory is what costs, not the bytes)."""
    parts = max(1, min(os.cpu_count() or 1, 4, size // _PARALLEL_MIN_BYTES))
    bounds = [size * i // parts for i in range(parts + 1)]

    def copy(i: int) -> int:
        crc = 0
        view = memoryview(bytearray(_COPY_CHUNK_BYTES))
        done = bounds[i]
        while done < bounds[i + 1]:
            try:
                n = os.preadv(fd, [view[:min(_COPY_CHUNK_BYTES, bounds[i + 1] - done)]], done)
                if n and os.pwrite(memfd, view[:n], done) != n:
                    raise OSError(errno.EIO, "short write into a memory file")
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise CheckpointCorruptError(f"{where} has {size} bytes, more than the memory available to "
                                                 "read it into") from None
                raise CheckpointCorruptError(f"{where} cannot be read ({e})") from e
            if not n:
                raise CheckpointCorruptError(f"{where} ended after {done} of {size} bytes (truncated while "
                                             "being read)")
            if checksum:
                crc = crc32(view[:n], crc)
            done += n
        return crc

    if parts == 1:
        return copy(0)
    with ThreadPoolExecutor(parts - 1, thread_name_prefix="supervisor-read") as pool:
        futures = [pool.submit(copy, i) for i in range(1, parts)]
        crc = copy(0)
        for i, future in enumerate(futures, start=1):
            crc = crc32_combine(crc, future.result(), bounds[i + 1] - bounds[i])
    return crc


def _buffer_copy(fd: int, size: int, where: str, checksum: bool) -> PrivateCopy:
    buffer = _allocate(size, where)
    view = memoryview(buffer)
    crc = 0
    done = 0
    try:
        while done < size:
            try:
                n = os.preadv(fd, [view[done:done + _CHUNK_BYTES]], done)
            except OSError as e:
                raise CheckpointCorruptError(f"{where} cannot be read ({e})") from e
            if not n:
                raise CheckpointCorruptError(f"{where} ended after {done} of {size} bytes (truncated while "
                                             "being read)")
            if checksum:
                crc = crc32(view[done:done + n], crc)
            done += n
    finally:
        view.release()
    return PrivateCopy(size, crc if checksum else None, data=buffer)


def check_fits(size: int, where: str) -> None:
    """Refuses (as damage) a file that cannot fit in memory: a sparse file whose manifest claims a
    terabyte must not end the reader with a MemoryError (or the OOM killer)."""
    available = available_memory_bytes()
    if available is not None and size > available:
        raise CheckpointCorruptError(f"{where} has {size} bytes, more than the {available} bytes of memory "
                                     "available to read it into (a sparse or damaged file, or a checkpoint too "
                                     "large to read on this machine)")
