"""The storage seam (SPEC §16): every filesystem call of the runtime goes through one `Storage`.

A `Storage` names its files by strings in its own spelling: OS paths for `LocalStorage`,
``s3://bucket/key`` URLs for the object store (`supervisor.checkpoint.object_store`). The
operations are the ones the checkpoint engine needs, with the guarantees it relies on:

* `open_write` — a new file, written in order, its CRC-32 computed while it is written
  (``nbytes``, ``checksum``; no second read); ``sync()`` makes it durable and visible (fsync /
  completing the multipart upload), ``close()`` without ``sync()`` abandons it.
* `write_atomic` — a small object replaced whole (readers see the old or the new one).
* `create_exclusive` — a small object created only if absent (``O_EXCL``/``link`` locally,
  ``If-None-Match: *`` on S3); `ObjectExistsError` otherwise. The content is complete the moment
  the name appears.
* `replace_if` — replaced only while it still is the version read (`ObjectInfo.version`:
  the ETag on S3); `PreconditionFailedError` otherwise. On S3 the server checks atomically;
  locally it is compare-then-replace, atomic only among writers that hold the logdir's lock
  (see `LocalStorage.replace_if`).
* `read_bytes` / `read_versioned` / `read_range` / `open_read` — regular files only (a FIFO or a
  device named like a checkpoint file never blocks a reader).
* `stat`, `listdir`, `list_files`, `remove`, `remove_tree`, `makedirs`.
* The directory commit, orbax's ``TemporaryPath`` idea: `stage` names where a checkpoint's files
  are written, `commit` seals it with its manifest and makes it visible in one step — rename of
  a temp directory on POSIX, the manifest written last with a conditional create on an object
  store (no rename there: a checkpoint exists if and only if its manifest exists) — and
  `discard` removes a staged one.

`storage_for(path_or_url)` picks the implementation by URL scheme: a local path or ``file://``
→ `LocalStorage`; ``s3://`` → ``ObjectStoreStorage`` (needs the extra
``pip install "torch-supervisor[s3]"``; imported only then, so the runtime never needs s3fs).
Other schemes can be added with `register_scheme`.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat as stat_module
import urllib.parse
from dataclasses import dataclass
from typing import IO, Any, Callable, Mapping, Protocol, runtime_checkable

from supervisor.checkpoint.fileio import ChecksumWriter, Opener, default_opener

__all__ = [
    "ObjectExistsError", "ObjectInfo", "PreconditionFailedError", "Storage", "StorageWriter",
    "LocalStorage", "register_scheme", "storage_for", "split_scheme",
]

logger = logging.getLogger(__name__)


class PreconditionFailedError(OSError):
    """A conditional write was refused: the object is no longer the version it was read at
    (HTTP 412 on an object store). Nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ESTALE, message)

    def __str__(self) -> str:
        return self.strerror or ""


class ObjectExistsError(PreconditionFailedError, FileExistsError):
    """A create-only write found the object already there (``If-None-Match: *`` refused,
    ``EEXIST`` locally). Nothing was written."""


@dataclass(frozen=True)
class ObjectInfo:
    """What `Storage.stat` knows about a file/object.

    Attributes:
        path: its name in the storage's spelling.
        size: bytes.
        version: an opaque token that changes with every write (the ETag on S3;
            inode, mtime and size locally); `Storage.replace_if` takes it.
        mtime: last modification, seconds since the epoch.
    """

    path: str
    size: int
    version: str
    mtime: float


@runtime_checkable
class StorageWriter(Protocol):
    """A file being written by `Storage.open_write` (what ``ChecksumWriter`` wraps)."""

    nbytes: int  # bytes written so far
    checksum: str  # "crc32:%08x" of those bytes, computed while writing (no second read)

    def write(self, data: Any) -> int: ...

    def flush(self) -> None: ...

    def sync(self) -> None:
        """Makes everything written durable and visible under the name (fsync / complete)."""

    def close(self) -> None:
        """Releases it; without a `sync` first the file is abandoned (removed / aborted)."""


@runtime_checkable
class Storage(Protocol):
    """The operations the runtime's checkpoint, index, lock/lease, events and exports code uses.
    See the module docstring for each one's guarantee."""

    def join(self, base: str, *parts: str) -> str: ...
    def dirname(self, path: str) -> str: ...
    def basename(self, path: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def open_write(self, path: str) -> StorageWriter: ...
    def write_atomic(self, path: str, data: bytes) -> ObjectInfo: ...
    def create_exclusive(self, path: str, data: bytes) -> ObjectInfo: ...
    def replace_if(self, path: str, data: bytes, version: str) -> ObjectInfo: ...
    def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes: ...
    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]: ...
    def read_range(self, path: str, start: int, length: int) -> bytes: ...
    def open_read(self, path: str) -> IO[bytes]: ...
    def stat(self, path: str) -> ObjectInfo: ...
    def exists(self, path: str) -> bool: ...
    def isdir(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def list_files(self, path: str) -> list[str]: ...
    def remove(self, path: str) -> bool: ...
    def remove_tree(self, path: str) -> None: ...
    def stage(self, directory: str, name: str) -> str: ...
    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None: ...
    def discard(self, staged: str) -> None: ...


# ---------------------------------------------------------------- local
class _LocalWriter(ChecksumWriter):
    """`ChecksumWriter` on a new local file (CRC-32 pipelined with the writes, ``sync()`` =
    fsync); the file is removed when closed without a successful `sync`."""

    def __init__(self, path: str, opener: Opener) -> None:
        super().__init__(opener(path))
        self.path = path
        self._synced = False
        self._ended = False

    def sync(self) -> None:
        super().sync()
        self._synced = True

    def close(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            super().close()
        finally:
            if not self._synced:
                _remove_quietly(self.path)


class LocalStorage:
    """Today's POSIX behaviour: files fsynced, then their directory; ``os.replace`` for atomic
    replacement, ``link``/``O_EXCL`` for exclusive creation, renames for the commit; reads open
    regular files only (``O_NONBLOCK`` + ``fstat``), so a FIFO never blocks a reader."""

    scheme = "file"

    def __init__(self, opener: Opener | None = None) -> None:
        self._opener = opener


    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def dirname(self, path: str) -> str:
        return os.path.dirname(path)

    def basename(self, path: str) -> str:
        return os.path.basename(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    # ------------------------------------------------------------ writing
    def open_write(self, path: str) -> _LocalWriter:
        """A new file (``FileExistsError`` when ``path`` exists), checksummed while written,
        fsynced by ``sync()``; ``opener`` (tests: one whose writes fail with ``ENOSPC``) opens it."""
        return _LocalWriter(path, self._opener or default_opener)

    def write_atomic(self, path: str, data: bytes) -> ObjectInfo:
        """Temp file beside it, fsync, ``os.replace``, fsync of the directory."""
        tmp = self._write_temp(path, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            _remove_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(path) or ".")
        return self.stat(path)

    def create_exclusive(self, path: str, data: bytes) -> ObjectInfo:
        """Written whole to a temp file, fsynced, then ``link``\\ ed to ``path`` — atomic and
        exclusive on local filesystems, NFSv3+ and Lustre alike (``link`` fails with ``EEXIST``),
        so the name never shows a partial file. Where hard links are refused (``EPERM``, some
        FUSE/SMB mounts) it falls back to ``O_CREAT|O_EXCL`` and writes in place."""
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExistsError(f"{path} already exists") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            self._create_in_place(path, data)
        finally:
            _remove_quietly(tmp)
        fsync_dir(os.path.dirname(path) or ".")
        return self.stat(path)

    def _create_in_place(self, path: str, data: bytes) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise ObjectExistsError(f"{path} already exists") from None
        with open(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def replace_if(self, path: str, data: bytes, version: str) -> ObjectInfo:
        """Replaces ``path`` if it still is ``version`` (`PreconditionFailedError` if not,
        ``FileNotFoundError`` if it is gone).

        POSIX has no compare-and-swap on a name: this compares, then ``os.replace``\\ s. It is
        exact against every earlier write, but two writers calling it at the same instant can
        both succeed; the logdir's lock (``flock`` or the lease, which itself needs only
        `create_exclusive`) is what keeps a second writer out."""
        tmp = self._write_temp(path, data)
        try:
            current = self.stat(path).version
            if current != version:
                raise PreconditionFailedError(f"{path} changed since it was read (version {current}, "
                                              f"expected {version}); another writer moved it")
            os.replace(tmp, path)
        except BaseException:
            _remove_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(path) or ".")
        return self.stat(path)

    def _write_temp(self, path: str, data: bytes) -> str:
        tmp = f"{path}.tmp-{os.urandom(16).hex()}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            _remove_quietly(tmp)
            raise
        return tmp

    # ------------------------------------------------------------ reading
    def open_read(self, path: str) -> IO[bytes]:
        """Opens a regular file for reading; ``OSError(EINVAL)`` for a FIFO, device or socket
        (opened with ``O_NONBLOCK`` so a FIFO cannot block the open, then checked by fstat)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if stat_module.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, f"{path} is a directory")
            if not stat_module.S_ISREG(mode):
                raise OSError(errno.EINVAL, f"{path} is not a regular file")
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)
            return open(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise

    def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return self.read_versioned(path, max_bytes=max_bytes)[0]

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """The whole content and the version it was read at (for a later `replace_if`)."""
        with self.open_read(path) as f:
            info = _info(path, os.fstat(f.fileno()))
            if max_bytes is not None and info.size > max_bytes:
                raise OSError(errno.EFBIG, f"{path} has {info.size} bytes, more than the {max_bytes} expected")
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise OSError(errno.EFBIG, f"{path} grew past the {max_bytes} bytes expected while being read")
        return data, info

    def read_range(self, path: str, start: int, length: int) -> bytes:
        with self.open_read(path) as f:
            return os.pread(f.fileno(), length, start) if length > 0 else b""

    def stat(self, path: str) -> ObjectInfo:
        return _info(path, os.stat(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        """Sorted names directly inside ``path`` (``FileNotFoundError`` when it is missing)."""
        return sorted(os.listdir(path))

    def list_files(self, path: str) -> list[str]:
        """Every regular file under ``path``, as sorted ``/``-separated relative paths."""
        found = []
        for root, _, files in os.walk(path):
            for name in files:
                found.append(os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/"))
        return sorted(found)

    # ------------------------------------------------------------ removing
    def remove(self, path: str) -> bool:
        """Removes one file; False when it was already gone."""
        try:
            os.remove(path)
        except FileNotFoundError:
            return False
        return True

    def remove_tree(self, path: str) -> None:
        """Removes a directory tree (what it cannot remove is logged, not raised)."""
        def report(function: Any, failed: str, exc_info: Any) -> None:
            error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
            if not isinstance(error, FileNotFoundError):
                logger.warning("could not remove %s: %s", failed, error)

        shutil.rmtree(path, onerror=report)  # onexc from 3.12; onerror still works there

    # ------------------------------------------------------------ the directory commit
    def stage(self, directory: str, name: str) -> str:
        """Creates and returns ``<directory>/<name>.tmp-<32 hex digits>/``."""
        path = os.path.join(directory, f"{name}.tmp-{os.urandom(16).hex()}")
        os.mkdir(path)
        return path

    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None:
        """Writes the manifest (fsynced), fsyncs every directory of ``staged``, renames it to
        ``final`` and fsyncs the parent. A committed ``final`` of the same name is moved aside
        first and removed after, so the name always holds a whole checkpoint or none."""
        self.create_exclusive(os.path.join(staged, manifest_name), manifest)
        for root, _, _ in os.walk(staged):
            fsync_dir(root)
        try:
            os.rename(staged, final)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR) or not os.path.isdir(final):
                raise
            aside = f"{final}.deleting-{os.urandom(16).hex()}"
            os.rename(final, aside)
            os.rename(staged, final)
            self.remove_tree(aside)
        fsync_dir(os.path.dirname(final) or ".")

    def discard(self, staged: str) -> None:
        self.remove_tree(staged)


def _info(path: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(path=path, size=st.st_size, version=f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}",
                      mtime=st.st_mtime)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def fsync_dir(path: str) -> None:
    """Makes a directory's entries durable (``EINVAL`` from filesystems that refuse is ignored)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


# ---------------------------------------------------------------- registration
#: ``scheme -> (factory(url, storage_options) -> Storage, the pip extra that provides it)``
_FACTORIES: dict[str, tuple[Callable[[str, Mapping[str, Any]], Storage], str | None]] = {}
_LOCAL = LocalStorage()
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def register_scheme(scheme: str, factory: Callable[[str, Mapping[str, Any]], Storage],
                    extra: str | None = None) -> None:
    """Makes ``storage_for`` answer URLs ``<scheme>://...`` with ``factory(url, options)``.
    ``factory`` may raise ``ImportError`` when its client is missing; ``extra`` names the pip
    extra the error then asks for."""
    _FACTORIES[scheme.lower()] = (factory, extra)


def split_scheme(path_or_url: str | os.PathLike) -> tuple[str, str]:
    """``("file", path)`` for a local path or ``file://`` URL, else ``(scheme, url)``."""
    text = os.fspath(path_or_url)
    if not isinstance(text, str):
        raise TypeError(f"a logdir must be a str path or URL, got {text!r}")
    match = _SCHEME.match(text)
    if match is None or len(match.group(1)) == 1:  # "C://..." on Windows is a drive, not a scheme
        return "file", text
    scheme = match.group(1).lower()
    if scheme == "file":
        return "file", urllib.parse.unquote(urllib.parse.urlparse(text).path)
    return scheme, text


def storage_for(path_or_url: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The `Storage` that serves ``path_or_url``: `LocalStorage` for local paths and
    ``file://``; the registered backend for other schemes (``s3://`` → the object store).

    Raises:
        ValueError: an unknown scheme (the message names the URL and the known schemes).
        ImportError: the scheme's optional client is not installed (the message names the
            extra, e.g. ``pip install "torch-supervisor[s3]"``).
    """
    scheme, url = split_scheme(path_or_url)
    if scheme == "file":
        if storage_options:
            raise ValueError(f"storage_options={dict(storage_options)!r} were given for the local path "
                             f"{url!r}; they apply to object-store URLs only (s3://...)")
        return _LOCAL
    _register_builtin()
    if scheme not in _FACTORIES:
        known = ", ".join(sorted(["file"] + list(_FACTORIES)))
        raise ValueError(f"{os.fspath(path_or_url)!r}: no storage for the URL scheme {scheme!r} "
                         f"(known: {known}; a local path needs no scheme)")
    factory, extra = _FACTORIES[scheme]
    try:
        return factory(url, dict(storage_options or {}))
    except ImportError as e:
        hint = f'pip install "torch-supervisor[{extra}]"' if extra else "install its client"
        raise ImportError(f"{os.fspath(path_or_url)!r} needs the optional {scheme}:// client, which is not "
                          f"installed ({e}); install it with: {hint}") from e


def _register_builtin() -> None:
    if "s3" not in _FACTORIES:
        register_scheme("s3", _object_store_factory, extra="s3")


def _object_store_factory(url: str, options: Mapping[str, Any]) -> Storage:
    # Imported here, on first use of an s3:// URL, so the runtime never needs s3fs (the module
    # itself imports s3fs at its top, which is what raises ImportError when the extra is missing).
    from supervisor.checkpoint.object_store import ObjectStoreStorage

    return ObjectStoreStorage.from_url(url, options)
