"""The types of the storage seam: `Storage` (the base class every backend subclasses: the contract),
`StorageWriter`, `ObjectInfo` and the errors of conditional writes. See
`supervisor.checkpoint.storage` for what each operation guarantees; import from there.
"""
from __future__ import annotations

import abc
import errno
import re
from dataclasses import dataclass
from typing import IO, Any, Callable, ClassVar, Iterable, Mapping, Protocol, runtime_checkable

__all__ = ["ObjectExistsError", "ObjectInfo", "PreconditionFailedError", "REQUIRED_METHODS", "STORAGE_KINDS", "Snapshot",
           "SnapshotVanishedError", "Storage", "StorageWriter", "check_declared", "MANIFEST_FILE"]

#: The manifest of a committed checkpoint (`Storage.commit` writes it last): on an object
#: store a checkpoint exists if and only if it holds this object. The layout's name too (layout/format.py).
MANIFEST_FILE = "MANIFEST.json"


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

    # Optional: ``listing`` — on an object store, the keys under the checkpoint's prefix when the
    # snapshot was taken (a manifest naming a data root nothing lies under is orphaned: fencing.py).

    def vanished(self) -> bool:
        """Whether the directory was deleted or moved aside since the snapshot was taken."""

    def close(self) -> None: ...


#: The two kinds of backend (`Storage.kind`).
STORAGE_KINDS = ("local", "object")
_SCHEME_SPELLING = re.compile(r"^[a-z][a-z0-9+.-]+$")


class Storage(abc.ABC):
    """The backend contract: what the runtime's checkpoint, index, lock/lease, events and exports
    code uses. Every backend subclasses it; see `supervisor.checkpoint.storage` for each
    operation's guarantee, and tests/storage/conformance.py for the suite a backend passes.

    Required (a concrete subclass without one fails when the class is defined, naming it):

    * ``scheme`` (class attribute): the URL scheme it serves, lowercase (``"file"``, ``"s3"``).
    * ``kind`` (class attribute): ``"local"`` — POSIX paths; `stage` names a temp directory
      that `commit` renames into place; the writer lock is an OS file lock — or ``"object"`` —
      names are URLs; `stage` names the final prefix, which becomes a checkpoint when its
      manifest appears (a manifest-less prefix is an interrupted write), each save's files go
      under a data root of its own (`supervisor.checkpoint.layout.fencing`) and the writer lock is a
      lease. Only the ``file`` scheme is local: a URL of any other scheme names an object store.
    * every abstract method below.

    Optional capabilities, with their defaults here (a backend overrides what it has):

    * ``part_size`` (8 MiB): the piece large reads are split into (sharded restores).
    * ``max_concurrency`` (8): pieces read in parallel per file.
    * `abort_uploads` (nothing to abort): unfinished multipart uploads of a killed writer.

    Derived, never overridden: `is_object_store` (``kind == "object"``; the one way to ask) and
    its older name ``stages_in_place``."""

    scheme: ClassVar[str]
    kind: ClassVar[str]
    part_size: int = 8 << 20
    max_concurrency: int = 8

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if any(getattr(getattr(cls, n, None), "__isabstractmethod__", False) for n in REQUIRED_METHODS):
            return  # an abstract intermediate class: checked in its concrete subclasses
        check_declared(cls)

    @property
    def is_object_store(self) -> bool:
        """Whether this is an object store (``kind == "object"``; see the class docstring)."""
        return self.kind == "object"

    @property
    def stages_in_place(self) -> bool:
        """The older name of `is_object_store` (`stage` names the final prefix)."""
        return self.kind == "object"

    def abort_uploads(self, path: str, accept: Callable[[str], bool]) -> list[str]:
        """Aborts the unfinished uploads under ``path/`` whose relative name ``accept``\\ s and
        returns their names; a backend without multipart uploads has none."""
        return []

    @abc.abstractmethod
    def join(self, base: str, *parts: str) -> str: ...
    @abc.abstractmethod
    def dirname(self, path: str) -> str: ...
    @abc.abstractmethod
    def basename(self, path: str) -> str: ...
    @abc.abstractmethod
    def makedirs(self, path: str) -> None: ...
    @abc.abstractmethod
    def open_write(self, path: str) -> StorageWriter: ...
    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes) -> ObjectInfo: ...
    @abc.abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> ObjectInfo: ...
    @abc.abstractmethod
    def replace_if(self, path: str, data: bytes, version: str) -> ObjectInfo: ...
    @abc.abstractmethod
    def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes: ...
    @abc.abstractmethod
    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]: ...
    @abc.abstractmethod
    def read_range(self, path: str, start: int, length: int) -> bytes: ...
    @abc.abstractmethod
    def open_read(self, path: str) -> IO[bytes]: ...
    @abc.abstractmethod
    def open_snapshot(self, directory: str, names: Iterable[str]) -> Snapshot: ...
    @abc.abstractmethod
    def stat(self, path: str) -> ObjectInfo: ...
    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...
    @abc.abstractmethod
    def isdir(self, path: str) -> bool: ...
    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]: ...
    @abc.abstractmethod
    def list_files(self, path: str) -> list[str]: ...
    @abc.abstractmethod
    def remove(self, path: str) -> bool: ...
    @abc.abstractmethod
    def remove_tree(self, path: str) -> None: ...
    @abc.abstractmethod
    def stage(self, directory: str, name: str) -> str: ...
    @abc.abstractmethod
    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None: ...
    @abc.abstractmethod
    def discard(self, staged: str) -> None: ...
    @abc.abstractmethod
    def uncommit(self, final: str) -> str | None: ...
    @abc.abstractmethod
    def entry_kind(self, path: str) -> str | None: ...
    @abc.abstractmethod
    def checksum(self, path: str) -> tuple[int, str]: ...
    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None: ...
    @abc.abstractmethod
    def sync_dir(self, path: str) -> None: ...


#: The methods every backend implements (the abstract methods of `Storage`).
REQUIRED_METHODS = ("join", "dirname", "basename", "makedirs", "open_write", "write_atomic", "create_exclusive",
                    "replace_if", "read_bytes", "read_versioned", "read_range", "open_read", "open_snapshot",
                    "stat", "exists", "isdir", "listdir", "list_files", "remove", "remove_tree", "stage", "commit",
                    "discard", "uncommit", "entry_kind", "checksum", "rename", "sync_dir")


def check_declared(backend: Any, scheme: str | None = None) -> None:
    """Refuses a backend (a class or an instance) that does not declare the contract of `Storage`:
    not a subclass, a required method missing, ``scheme``/``kind`` missing or wrong, or (``scheme``
    given: the URL scheme it was registered for) a different scheme. `TypeError` naming the
    member and the fix."""
    cls = backend if isinstance(backend, type) else type(backend)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if not issubclass(cls, Storage):
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
        raise TypeError(f"the storage backend {name} does not subclass supervisor.checkpoint.storage.Storage"
                        + (f" (and lacks {', '.join(missing)})" if missing else "")
                        + "; subclass it, which declares the contract and the optional capabilities' defaults")
    for member in ("scheme", "kind"):
        if not isinstance(getattr(cls, member, None), str):
            raise TypeError(f"the storage backend {name} declares no {member!r} (a str class attribute); add "
                            + ("scheme = '<the URL scheme it serves>'" if member == "scheme"
                               else f"kind = one of {STORAGE_KINDS}") + " to the class")
    if cls.kind not in STORAGE_KINDS:
        raise TypeError(f"the storage backend {name} declares kind={cls.kind!r}; use one of {STORAGE_KINDS}")
    if not _SCHEME_SPELLING.fullmatch(cls.scheme) or (cls.kind == "local") != (cls.scheme == "file"):
        raise TypeError(f"the storage backend {name} declares scheme={cls.scheme!r} with kind={cls.kind!r}: a "
                        "scheme is lowercase (letters, digits, +.-), and only 'file' is local (a URL of any other "
                        "scheme names an object store: kind='object')")
    if scheme is not None and cls.scheme != scheme:
        raise TypeError(f"the storage backend {name} serves scheme={cls.scheme!r}, but it was registered for "
                        f"{scheme}:// URLs; register it for {cls.scheme!r} or fix its scheme")
