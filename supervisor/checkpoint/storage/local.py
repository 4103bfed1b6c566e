"""`LocalStorage`: the `Storage` of local paths and shared POSIX filesystems (NFS, Lustre) —
today's behaviour of the checkpoint engine (fsync of files and directories, ``os.replace``,
exclusive creation, renames for the commit, regular-file-only reads)."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import stat as stat_module
import sys
from typing import IO, Any, Iterable

from supervisor.checkpoint.storage.fileio import (ChecksumWriter, NotARegularFileError, Opener, checksum_file, default_opener,
                                          file_kind, fsync_dir)
from supervisor.checkpoint.storage.local_snapshot import LocalSnapshot
from supervisor.checkpoint.storage.base import (ObjectExistsError, ObjectInfo, PreconditionFailedError,
                                                SnapshotVanishedError, Storage)

__all__ = ["LocalStorage", "rename_into_place"]

logger = logging.getLogger(__name__)


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



def deleting_name(name: str) -> str:
    """The name a directory is moved aside to before it is deleted (``format.is_transient``
    knows it: a crash mid-delete leaves a name the next writer removes)."""
    return f"{name}.deleting-{os.urandom(16).hex()}"

class LocalStorage(Storage):
    """Today's POSIX behaviour: files fsynced, then their directory; ``os.replace`` for atomic
    replacement, ``link``/``O_EXCL`` for exclusive creation, renames for the commit; reads open
    regular files only (``O_NONBLOCK`` + ``fstat``), so a FIFO never blocks a reader."""

    scheme = "file"
    #: Checkpoints are staged in a temp directory and renamed into place (see `Storage`).
    kind = "local"

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
        return self._replace(path, data, expected_version=None)

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
        return self._replace(path, data, expected_version=version)

    def _replace(self, path: str, data: bytes, *, expected_version: str | None) -> ObjectInfo:
        """``data`` into a fsynced temp file beside ``path``, then (when ``path`` still is
        ``expected_version``, if one is given) ``os.replace`` and a fsync of the directory."""
        tmp = self._write_temp(path, data)
        try:
            if expected_version is not None:
                current = self.stat(path).version
                if current != expected_version:
                    raise PreconditionFailedError(f"{path} changed since it was read (version {current}, "
                                                  f"expected {expected_version}); another writer moved it")
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
        """Opens a regular file for reading; `NotARegularFileError` (an ``OSError``) for a
        FIFO, device or socket
        (opened with ``O_NONBLOCK`` so a FIFO cannot block the open, then checked by fstat)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if stat_module.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, f"{path} is a directory")
            if not stat_module.S_ISREG(mode):
                raise NotARegularFileError(f"{path} is not a regular file ({file_kind(mode)}); refusing to read it")
            if hasattr(os, "set_blocking"):
                os.set_blocking(fd, True)
            return open(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise

    def open_snapshot(self, directory: str, names: Iterable[str]) -> LocalSnapshot:
        """Opens ``directory`` (``O_DIRECTORY``) and then, relative to that descriptor, every
        name (regular files only, ``O_NONBLOCK`` + ``fstat``), before anything is read.

        Raises:
            SnapshotVanishedError: the directory is gone, or was moved aside while opening.
            FileNotFoundError: a name is missing from the (still present) directory.
            ValueError: a name that is not a plain file name of the directory.
        """
        try:
            dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except FileNotFoundError:
            raise SnapshotVanishedError(errno.ENOENT, f"{directory} does not exist (deleted before it could "
                                        "be read)") from None
        snapshot = LocalSnapshot(directory, dir_fd)
        try:
            for name in names:
                snapshot.open(name)
        except BaseException:
            snapshot.close()
            raise
        return snapshot

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

        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=report)
        else:
            shutil.rmtree(path, onerror=report)

    # ------------------------------------------------------------ the directory commit
    def stage(self, directory: str, name: str) -> str:
        """Creates and returns ``<directory>/<name>.tmp-<32 hex digits>/``."""
        path = os.path.join(directory, f"{name}.tmp-{os.urandom(16).hex()}")
        os.mkdir(path)
        return path

    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None:
        """Writes the manifest into ``staged`` (a new file through `open_write`, fsynced), fsyncs
        every directory of ``staged``, renames it to ``final`` (`rename_into_place`) and fsyncs
        the parent. A committed ``final`` of the same name is moved aside first and removed
        after, so the name always holds a whole checkpoint or none."""
        with self.open_write(os.path.join(staged, manifest_name)) as writer:
            writer.write(manifest)
            writer.sync()
        for root, _, _ in os.walk(staged):
            fsync_dir(root)
        rename_into_place(staged, final)
        fsync_dir(os.path.dirname(final) or ".")

    def discard(self, staged: str) -> None:
        self.remove_tree(staged)

    def uncommit(self, final: str) -> str | None:
        """Renames the committed ``final`` to ``<final>.deleting-<hex>`` (atomic: a reader finds
        the whole checkpoint or nothing) and returns that name; None when ``final`` is gone."""
        aside = os.path.join(os.path.dirname(final), deleting_name(os.path.basename(final)))
        try:
            os.rename(final, aside)
        except FileNotFoundError:
            return None
        return aside

    def entry_kind(self, path: str) -> str | None:
        """``"file"``, ``"dir"``, ``"link"`` (not followed), ``"other"`` (FIFO, device, socket)
        or None when nothing is there; nothing is opened."""
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        if stat_module.S_ISLNK(mode):
            return "link"
        if stat_module.S_ISDIR(mode):
            return "dir"
        return "file" if stat_module.S_ISREG(mode) else "other"

    def checksum(self, path: str) -> tuple[int, str]:
        """fsyncs a file some other writer made (e.g. DCP's ``.metadata``), then returns its
        size and CRC-32, read once (`supervisor.checkpoint.storage.fileio.checksum_file`)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return checksum_file(path)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)  # no fsync: sync_dir the parent when it must be durable

    def sync_dir(self, path: str) -> None:
        """fsyncs a directory, making its entries (created, renamed, removed files) durable."""
        fsync_dir(path or ".")


def rename_into_place(tmp: str, final: str) -> None:
    """Renames a sealed temp directory to its committed name (every local commit goes through
    here; crash tests interpose on ``supervisor.checkpoint.storage.local.rename_into_place``).

    Re-saving a step that is already committed (e.g. after a hand rollback) moves the old one
    aside first, so the name always holds a complete checkpoint or none.
    """
    try:
        os.rename(tmp, final)
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR) or not os.path.isdir(final):
            raise
    logger.debug("replacing the existing checkpoint %s with a new save of the same step", final)
    aside = os.path.join(os.path.dirname(final), deleting_name(os.path.basename(final)))
    os.rename(final, aside)
    os.rename(tmp, final)
    LocalStorage().remove_tree(aside)


def _info(path: str, st: os.stat_result) -> ObjectInfo:
    return ObjectInfo(path=path, size=st.st_size, version=f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}",
                      mtime=st.st_mtime)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
