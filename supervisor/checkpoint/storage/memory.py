"""`MemoryStorage`: the `Storage` of ``memory://`` URLs, on fsspec's in-process memory filesystem.

An object store in one process's memory (``kind = "object"``: names are URLs, a checkpoint is
written at its final prefix and exists once its manifest does, the writer lock is a lease): for
tests, notebooks and a proof of the storage seam — it is one module and one registration
(`supervisor.checkpoint.storage._register_builtin`), and passes tests/storage/conformance.py.

Its objects are fsspec's (``fsspec.filesystem("memory").store``, keyed ``/<bucket>/<key>``), so
``fsspec.open("memory://bucket/key")`` reads what it wrote. Every operation holds one lock of the
process: the conditional writes (`create_exclusive`, `replace_if`) are atomic among its threads.
Nothing survives the process, and another process sees none of it.
"""
from __future__ import annotations

import errno
import io
import itertools
import posixpath
import threading
import time
from typing import IO, Any, Iterable, Mapping

import fsspec
from fsspec.implementations.memory import MemoryFile

from supervisor.checkpoint.storage.fileio import crc32, format_checksum
from supervisor.checkpoint.storage.base import MANIFEST_FILE
from supervisor.checkpoint.storage.base import (ObjectExistsError, ObjectInfo, PreconditionFailedError,
                                                SnapshotVanishedError, Storage)

__all__ = ["MemoryStorage"]

_LOCK = threading.RLock()
_VERSIONS = itertools.count(1)


class _MemoryWriter:
    """A new object, collected in memory and checksummed while written; `sync` publishes it
    whole, create-only (`MemoryStorage.create_exclusive`: ``FileExistsError`` when the name is
    taken, as an object store's upload), `close` without it publishes nothing."""

    def __init__(self, storage: MemoryStorage, path: str) -> None:
        self.storage, self.path = storage, path
        self._data, self._crc, self._nbytes = bytearray(), 0, 0

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def checksum(self) -> str:
        return format_checksum(self._crc)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._data += view  # a copy: no reference to the caller's buffer outlives write
        self._crc = crc32(view, self._crc)
        self._nbytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        """Nothing to do: `sync` publishes."""

    def sync(self) -> None:
        self.storage.create_exclusive(self.path, bytes(self._data))

    def close(self) -> None:
        self._data = bytearray()

    def __enter__(self) -> _MemoryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _MemorySnapshot:
    """The objects under a directory as one listing saw them, their bytes taken then (see
    `supervisor.checkpoint.storage.base.Snapshot`); ``listing``: relative key -> `ObjectInfo`."""

    def __init__(self, storage: MemoryStorage, directory: str, names: Iterable[str]) -> None:
        self.storage, self.directory = storage, directory
        with _LOCK:
            self._bytes = {rel: obj.getvalue() for rel, obj in storage.objects(directory).items()}
            self.listing = {rel: storage.stat(storage.join(directory, rel)) for rel in self._bytes}
        if not self.listing:
            raise SnapshotVanishedError(errno.ENOENT, f"{directory} does not exist (deleted before it could be read)")
        self.files: dict[str, IO[bytes]] = {}
        self.sizes: dict[str, int] = {}
        for name in names:
            self.open(name)

    def open(self, name: str) -> None:
        if name.count("/") > 1 or any(part in ("", ".", "..") for part in name.split("/")):
            raise ValueError(f"{self.directory}: {name!r} is not a file name of the directory")
        if name not in self._bytes:
            raise FileNotFoundError(errno.ENOENT, f"{self.directory}: {name} is missing", name)
        self.files[name] = io.BytesIO(self._bytes[name])
        self.sizes[name] = len(self._bytes[name])

    def vanished(self) -> bool:
        return not self.storage.isdir(self.directory)

    def close(self) -> None:
        self.files.clear()

    def __enter__(self) -> _MemorySnapshot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class MemoryStorage(Storage):
    """`supervisor.checkpoint.storage.Storage` on fsspec's memory filesystem (the module docstring)."""

    scheme = "memory"
    kind = "object"

    def __init__(self) -> None:
        self.store: dict[str, MemoryFile] = fsspec.filesystem("memory").store

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> MemoryStorage:
        if storage_options:
            raise ValueError(f"storage_options={dict(storage_options)!r} were given for {url!r}: a memory:// "
                             "storage takes none; drop them")
        return cls()

    # ------------------------------------------------------------ names
    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def dirname(self, path: str) -> str:
        return f"memory://{posixpath.dirname(_key(path).rstrip('/')).lstrip('/')}".rstrip("/")

    def basename(self, path: str) -> str:
        return posixpath.basename(path.rstrip("/"))

    def makedirs(self, path: str) -> None:
        """Nothing to do: a prefix exists with its objects."""

    def objects(self, path: str) -> dict[str, MemoryFile]:
        """Every object under ``path/`` (relative key -> its `MemoryFile`)."""
        prefix = _key(path).rstrip("/") + "/"
        with _LOCK:
            return {key[len(prefix):]: obj for key, obj in self.store.items() if key.startswith(prefix)}

    # ------------------------------------------------------------ writing
    def open_write(self, path: str) -> _MemoryWriter:
        return _MemoryWriter(self, path)

    def write_atomic(self, path: str, data: bytes) -> ObjectInfo:
        with _LOCK:
            obj = MemoryFile(None, _key(path), bytes(data))
            obj.version = f"v{next(_VERSIONS)}"
            self.store[_key(path)] = obj
            return self.stat(path)

    def create_exclusive(self, path: str, data: bytes) -> ObjectInfo:
        with _LOCK:
            if _key(path) in self.store:
                raise ObjectExistsError(f"{path} already exists")
            return self.write_atomic(path, data)

    def replace_if(self, path: str, data: bytes, version: str) -> ObjectInfo:
        with _LOCK:
            current = self.stat(path).version
            if current != version:
                raise PreconditionFailedError(f"{path} changed since it was read (version {current}, expected "
                                              f"{version}); another writer moved it")
            return self.write_atomic(path, data)

    # ------------------------------------------------------------ reading
    def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return self.read_versioned(path, max_bytes=max_bytes)[0]

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        with _LOCK:
            info = self.stat(path)
            data = self.store[_key(path)].getvalue()
        if max_bytes is not None and len(data) > max_bytes:
            raise OSError(errno.EFBIG, f"{path} has {len(data)} bytes, more than the {max_bytes} expected")
        return data, info

    def read_range(self, path: str, start: int, length: int) -> bytes:
        return self.read_bytes(path)[start:start + max(length, 0)]

    def open_read(self, path: str) -> IO[bytes]:
        return io.BytesIO(self.read_bytes(path))

    def open_snapshot(self, directory: str, names: Iterable[str]) -> _MemorySnapshot:
        return _MemorySnapshot(self, directory, names)

    def stat(self, path: str) -> ObjectInfo:
        with _LOCK:
            obj = self.store.get(_key(path))
            if obj is None:
                if self.isdir(path):
                    raise IsADirectoryError(errno.EISDIR, f"{path} is a prefix (a directory), not an object")
                raise FileNotFoundError(errno.ENOENT, f"{path} does not exist", path)
            modified = getattr(obj, "modified", None)
            return ObjectInfo(path=path, size=len(obj.getbuffer()), version=getattr(obj, "version", f"id{id(obj)}"),
                              mtime=modified.timestamp() if modified is not None else time.time())

    def exists(self, path: str) -> bool:
        return _key(path) in self.store or self.isdir(path)

    def isdir(self, path: str) -> bool:
        return bool(self.objects(path))

    def listdir(self, path: str) -> list[str]:
        return sorted({rel.split("/", 1)[0] for rel in self.objects(path)})

    def list_files(self, path: str) -> list[str]:
        return sorted(self.objects(path))

    # ------------------------------------------------------------ removing
    def remove(self, path: str) -> bool:
        with _LOCK:
            return self.store.pop(_key(path), None) is not None

    def remove_tree(self, path: str) -> None:
        with _LOCK:
            for rel in self.objects(path):
                self.store.pop(_key(self.join(path, rel)), None)

    # ------------------------------------------------------------ the directory commit
    def stage(self, directory: str, name: str) -> str:
        """``<directory>/<name>``, written in place (``FileExistsError`` when committed; the
        leftovers of an interrupted write removed)."""
        final = self.join(directory, name)
        if self.exists(self.join(final, MANIFEST_FILE)):
            raise FileExistsError(errno.EEXIST, f"{final} is a committed checkpoint; remove it before saving the "
                                  "same step again")
        self.remove_tree(final)
        return final

    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None:
        if staged.rstrip("/") != final.rstrip("/"):
            raise ValueError(f"a memory:// storage commits in place: staged {staged!r} must be final {final!r}")
        self.create_exclusive(self.join(final, manifest_name), manifest)

    def discard(self, staged: str) -> None:
        if not self.exists(self.join(staged, MANIFEST_FILE)):
            self.remove_tree(staged)

    def uncommit(self, final: str) -> str | None:
        return final if self.remove(self.join(final, MANIFEST_FILE)) else None

    def entry_kind(self, path: str) -> str | None:
        if self.isdir(path):
            return "dir"
        return "file" if _key(path) in self.store else None

    def checksum(self, path: str) -> tuple[int, str]:
        data = self.read_bytes(path)
        return len(data), format_checksum(crc32(data))

    def rename(self, src: str, dst: str) -> None:
        raise OSError(errno.ENOTSUP, f"a memory:// storage has no rename ({src} -> {dst})")

    def sync_dir(self, path: str) -> None:
        """Nothing to do: an object is there once its write returned."""


def _key(path: str) -> str:
    """fsspec's key of a ``memory://`` URL: ``/<bucket>/<key>``."""
    rest = path.split("://", 1)[1] if "://" in path else path
    if not rest.strip("/"):
        raise ValueError(f"{path!r} names no bucket (expected memory://bucket/key)")
    return "/" + rest.strip("/")
