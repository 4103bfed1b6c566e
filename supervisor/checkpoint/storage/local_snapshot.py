"""`LocalSnapshot`: the files of one local directory opened together before any is read
(`LocalStorage.open_snapshot`; the `Snapshot` protocol of `storage_base`)."""
from __future__ import annotations

import errno
import os
import stat as stat_module
from typing import IO, Any

from supervisor.checkpoint.storage.fileio import NotARegularFileError, file_kind
from supervisor.checkpoint.storage.base import SnapshotVanishedError

__all__ = ["LocalSnapshot"]


class LocalSnapshot:
    """Open descriptors of one directory's files (see `LocalStorage.open_snapshot`)."""

    def __init__(self, directory: str, dir_fd: int) -> None:
        self.directory = directory
        self._dir_fd: int | None = dir_fd
        self.files: dict[str, IO[bytes]] = {}
        self.sizes: dict[str, int] = {}

    def open(self, name: str) -> None:
        if os.path.basename(name) != name or name in ("", os.curdir, os.pardir):
            raise ValueError(f"{self.directory}: {name!r} is not a file name of the directory")
        try:
            fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0), dir_fd=self._dir_fd)
        except FileNotFoundError:
            if self.vanished():
                raise SnapshotVanishedError(errno.ENOENT, f"{self.directory}: deleted while being opened") from None
            raise FileNotFoundError(errno.ENOENT, f"{self.directory}: {name} is missing", name) from None
        try:
            st = os.fstat(fd)
            if not stat_module.S_ISREG(st.st_mode):
                raise NotARegularFileError(f"{self.directory}: {name} is not a regular file "
                                           f"({file_kind(st.st_mode)}); refusing to read it")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        self.files[name] = open(fd, "rb", buffering=0)
        self.sizes[name] = st.st_size

    def vanished(self) -> bool:
        if self._dir_fd is None:
            raise ValueError(f"the snapshot of {self.directory} is closed")
        try:
            here = os.stat(self.directory)
        except FileNotFoundError:
            return True
        mine = os.fstat(self._dir_fd)
        return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino) or mine.st_nlink == 0

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def __enter__(self) -> LocalSnapshot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
