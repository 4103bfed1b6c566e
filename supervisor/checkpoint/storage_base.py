"""The types of the storage seam: `Storage` (the protocol every backend implements),
`StorageWriter`, `ObjectInfo` and the errors of conditional writes. See
`supervisor.checkpoint.storage` for what each operation guarantees; import from there.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import IO, Any, Iterable, Mapping, Protocol, runtime_checkable

__all__ = ["ObjectExistsError", "ObjectInfo", "PreconditionFailedError", "Snapshot", "SnapshotVanishedError",
           "Storage", "StorageWriter", "deleting_name"]


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


class SnapshotVanishedError(FileNotFoundError):
    """The directory of a `Snapshot` was deleted or moved aside before its files could be
    opened (a reader skips it: retention removed it, a newer checkpoint exists)."""


@runtime_checkable
class Snapshot(Protocol):
    """Files of one directory opened together, before any is read (`Storage.open_snapshot`):
    a reader of a checkpoint reads the bytes of one checkpoint, never a mix of two.

    Locally the files are open descriptors (POSIX keeps an unlinked file's data while it is
    open, so retention deleting the checkpoint mid-read costs nothing). On an object store each
    file is read with ``If-Match`` on the ETag listed when the snapshot was taken: an object
    replaced since is `PreconditionFailedError`, a deleted one ``FileNotFoundError``."""

    files: Mapping[str, IO[bytes]]  # name -> a binary reader (readinto, read, seek)
    sizes: Mapping[str, int]  # name -> its size when the snapshot was taken

    def open(self, name: str) -> None:
        """Adds ``name`` of the same directory to `files`/`sizes` (a reader opens the manifest
        first, then the files it lists, all in one snapshot); ``FileNotFoundError`` when it is
        missing, `SnapshotVanishedError` when the directory is gone."""

    def vanished(self) -> bool:
        """Whether the directory was deleted or moved aside since the snapshot was taken."""

    def close(self) -> None: ...


@runtime_checkable
class Storage(Protocol):
    """The operations the runtime's checkpoint, index, lock/lease, events and exports code uses.
    See the module docstring for each one's guarantee.

    ``stages_in_place``: False where `stage` names a temp directory that `commit` renames into
    place (POSIX); True where it names the final prefix, which becomes a checkpoint when its
    manifest appears (object stores: a manifest-less prefix there is an interrupted write)."""

    stages_in_place: bool

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
    def open_snapshot(self, directory: str, names: Iterable[str]) -> Snapshot: ...
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
    def uncommit(self, final: str) -> str | None: ...
    def entry_kind(self, path: str) -> str | None: ...
    def checksum(self, path: str) -> tuple[int, str]: ...
    def rename(self, src: str, dst: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...


def deleting_name(name: str) -> str:
    """The name a checkpoint is renamed to while it is deleted (``<name>.deleting-<random>``)."""
    return f"{name}.deleting-{os.urandom(16).hex()}"
