"""The types of the storage seam: `Storage` (the protocol every backend implements),
`StorageWriter`, `ObjectInfo` and the errors of conditional writes. See
`supervisor.checkpoint.storage` for what each operation guarantees; import from there.
"""
from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import IO, Any, Protocol, runtime_checkable

__all__ = ["ObjectExistsError", "ObjectInfo", "PreconditionFailedError", "Storage", "StorageWriter"]


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
        mtime: last modification, seconds since the epoch (0.0 where unknown: what a write on an
            object store returns; `Storage.stat` asks the server).
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
