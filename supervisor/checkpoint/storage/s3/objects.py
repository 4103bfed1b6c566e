"""Writing and reading objects of an `ObjectStoreStorage`: `MultipartWriter` (a new object,
written in parts uploaded in parallel while the caller keeps writing, its CRC-32 computed on the
way — no second read) and `ObjectSnapshot` (a checkpoint's objects read at the versions listed
once, with ranged ``GetObject`` and ``If-Match``)."""
from __future__ import annotations

import errno
import io
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol

from supervisor.checkpoint.storage.fileio import crc32, format_checksum
from supervisor.checkpoint.storage.s3.errors import run_bounded
from supervisor.checkpoint.storage.base import (ObjectExistsError, ObjectInfo, PreconditionFailedError,
                                                SnapshotVanishedError)

__all__ = ["MultipartWriter", "ObjectReader", "ObjectSnapshot", "ObjectStore", "READ_PIECE_BYTES", "fetch_object",
           "key_prefix", "mtime_of", "split_url", "stream_body"]

logger = logging.getLogger(__name__)

#: A streamed range (`stream_body`) is handed over in pieces of this size: each costs one hop to
#: the client's event loop; its CRC is computed while it is fresh.
READ_PIECE_BYTES = 2 << 20


class ObjectStore(Protocol):
    """What these readers and writers need of a store (`supervisor.checkpoint.storage.s3.store.
    ObjectStoreStorage` is one; declared here so that this module never imports it)."""

    part_size: int
    max_concurrency: int
    min_range_size: int
    multipart_checksum: str | None

    def call(self, method: str, path: str, **kwargs: Any) -> Any: ...

    def create_exclusive(self, path: str, data: bytes) -> Any: ...

    def read_range(self, path: str, start: int, length: int, *, if_match: str | None = None,
                   into: Any = None, on_piece: Callable[[memoryview], Any] | None = None) -> Any: ...

    def isdir(self, path: str) -> bool: ...

    def silent(self) -> bool: ...


class MultipartWriter:
    """A new object written in parts uploaded in parallel, CRC-32 computed on the way.

    Like a local ``open(path, "xb")`` it creates a new object: ``sync()`` uploads what is left
    and completes the upload create-only (``If-None-Match: *``; `ObjectExistsError` when the
    name was taken meanwhile) — the object appears whole, at once; ``close()`` without ``sync()`` aborts it (nothing appears). ``nbytes`` and
    ``checksum`` (``"crc32:%08x"``) describe what was written. Errors of the background
    uploads are raised by the next ``write``/``sync``.
    """

    def __init__(self, storage: ObjectStore, path: str) -> None:
        self.storage = storage
        self.path = path
        self.nbytes = 0
        self.crc = 0
        self._part: bytearray | None = None  # the part being filled
        self._filled = 0
        self._upload_id: str | None = None
        self._parts: list[tuple[int, Future]] = []
        self._slots = threading.BoundedSemaphore(2 * storage.max_concurrency)
        self._pool: ThreadPoolExecutor | None = None
        self._done = False
        self._closed = False

    @property
    def checksum(self) -> str:
        return format_checksum(self.crc)

    def write(self, data: Any) -> int:
        if self._closed or self._done:
            raise ValueError(f"write to {self.path} after it was closed or synced")
        view = memoryview(data).cast("B")
        self.crc = crc32(view, self.crc)
        self.nbytes += view.nbytes
        size, done = self.storage.part_size, 0
        while done < view.nbytes:  # straight into the part buffer: one copy, the one the upload needs
            if self._part is None:
                self._part, self._filled = bytearray(size), 0
            take = min(size - self._filled, view.nbytes - done)
            self._part[self._filled:self._filled + take] = view[done:done + take]
            self._filled += take
            done += take
            if self._filled == size:
                part, self._part = self._part, None
                self._submit(part)
        return view.nbytes

    def flush(self) -> None:
        """Nothing to do: parts go up when full; `sync` sends the rest."""

    def _rest(self) -> bytearray:
        """The bytes written since the last full part (the buffer itself, cut to size)."""
        part, self._part = self._part if self._part is not None else bytearray(), None
        del part[self._filled:]
        return part

    def _submit(self, part: bytearray) -> None:
        self._raise_failed()
        if self._upload_id is None:
            self._upload_id = self.storage.call("create_multipart_upload", self.path,
                                                **_algorithm(self.storage))["UploadId"]
            self._pool = ThreadPoolExecutor(self.storage.max_concurrency, thread_name_prefix="supervisor-upload")
        self._slots.acquire()
        number = len(self._parts) + 1
        future = self._pool.submit(self._upload_part, number, part)  # type: ignore[union-attr]
        future.add_done_callback(lambda _: self._slots.release())
        self._parts.append((number, future))

    def _upload_part(self, number: int, part: bytearray) -> dict[str, Any]:
        """Uploads one part; returns its entry of the completion's part list."""
        response = self.storage.call("upload_part", self.path, UploadId=self._upload_id, PartNumber=number, Body=part,
                                     **_algorithm(self.storage))
        entry = {"ETag": response["ETag"], "PartNumber": number}
        name = f"Checksum{self.storage.multipart_checksum}"
        if self.storage.multipart_checksum and response.get(name):
            entry[name] = response[name]
        return entry

    def _raise_failed(self) -> None:
        for _, future in self._parts:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]

    def sync(self) -> None:
        """Uploads the rest and completes the object (it appears whole)."""
        if self._done:
            return
        rest = self._rest()
        if self._upload_id is None:
            self.storage.create_exclusive(self.path, rest)
        else:
            if rest or not self._parts:
                self._submit(rest)
            parts = [future.result() for _, future in self._parts]
            try:
                self.storage.call("complete_multipart_upload", self.path, UploadId=self._upload_id, IfNoneMatch="*",
                                  MultipartUpload={"Parts": parts})
            except PreconditionFailedError:
                raise ObjectExistsError(f"{self.path} already exists: the create-only completion "
                                        "(If-None-Match: *) was refused") from None
        self._done = True

    def close(self) -> None:
        """Ends the writer; an upload not completed by `sync` is aborted (nothing appears)."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            for _, future in self._parts:
                future.cancel()
            self._pool.shutdown(wait=True)
        if self._upload_id is not None and not self._done:
            if self.storage.silent():
                logger.warning("not aborting the unfinished upload of %s now: a request to the store timed out; the "
                               "next writer opening the logdir aborts it", self.path)
                return
            try:
                self.storage.call("abort_multipart_upload", self.path, UploadId=self._upload_id)
            except OSError as e:
                logger.warning("could not abort the unfinished upload of %s: %s", self.path, e)

    def __enter__(self) -> MultipartWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _algorithm(storage: ObjectStore) -> dict[str, str]:
    """``ChecksumAlgorithm`` for a multipart upload's requests, when the store sets one."""
    return {"ChecksumAlgorithm": storage.multipart_checksum} if storage.multipart_checksum else {}


class ObjectReader(io.RawIOBase):
    """A seekable binary reader of one version of an object: every ``readinto`` is one ranged
    ``GetObject`` with ``If-Match: <etag>``, so the bytes all come from the version listed."""

    def __init__(self, storage: ObjectStore, path: str, size: int, etag: str) -> None:
        super().__init__()
        self.storage = storage
        self.path = path
        self.size = size
        self.etag = etag
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, f"{self.path}: seek to a negative position")
        self._position = base + offset
        return self._position

    def read_at(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` of the version listed (fewer at the end), with one
        ranged ``GetObject``; leaves the position alone, so threads may call it at once."""
        length = min(length, self.size - start)
        return self.storage.read_range(self.path, start, length, if_match=self.etag) if length > 0 else b""

    @property
    def parallelism(self) -> int:
        """Ranged requests a whole read of this object keeps in flight (the store's
        ``max_concurrency``)."""
        return self.storage.max_concurrency

    def range_bytes(self) -> int:
        """The range size of a whole read: the object split into `parallelism` ranges, rounded
        up to a MiB, each at least the store's ``min_range_size``. One request per range,
        streamed: few large ranges cost fewer requests than many small ones, and a server that
        pays per request what the object costs (moto copies the whole object for each ranged
        ``GetObject``) pays `parallelism` times, not ``size / 8 MiB`` times."""
        share = -(-self.size // self.parallelism)
        return max(self.storage.min_range_size, -(-share // (1 << 20)) << 20)

    def read_into(self, start: int, view: Any, on_piece: Callable[[memoryview], Any] | None = None) -> int:
        """Fills ``view`` with bytes ``[start, start + len(view))`` of the version listed (fewer
        at the end) with one ranged ``GetObject`` streamed straight into it, ``on_piece`` called
        on each piece as it arrives; returns the bytes read. Leaves the position alone, so
        threads may call it at once."""
        view = memoryview(view).cast("B")
        length = min(view.nbytes, self.size - start)
        if length <= 0:
            return 0
        return len(self.storage.read_range(self.path, start, length, if_match=self.etag, into=view,
                                           on_piece=on_piece))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        wanted = min(view.nbytes, self.size - self._position)
        if wanted <= 0:
            return 0
        data = self.storage.read_range(self.path, self._position, wanted, if_match=self.etag)
        view[:len(data)] = data
        self._position += len(data)
        return len(data)


class ObjectSnapshot:
    """Readers of a directory's objects at the versions one listing saw (see
    `supervisor.checkpoint.storage.base.Snapshot`)."""

    def __init__(self, storage: ObjectStore, directory: str, listing: Mapping[str, ObjectInfo],
                 names: Iterable[str]) -> None:
        self.storage = storage
        self.directory = directory
        if not listing:
            raise SnapshotVanishedError(errno.ENOENT, f"{directory} does not exist (deleted before it could be read)")
        self.listing = listing
        self.files: dict[str, ObjectReader] = {}
        self.sizes: dict[str, int] = {}
        for name in names:
            self.open(name)

    def open(self, name: str) -> None:
        """Adds a reader of ``name`` at the version the listing saw (a reader that read the
        manifest first opens the files it lists: all from the same listing). ``name`` may be
        ``<root>/<file>`` (a checkpoint's data root: supervisor.checkpoint.layout.fencing)."""
        if name.count("/") > 1 or any(part in ("", ".", "..") for part in name.split("/")):
            raise ValueError(f"{self.directory}: {name!r} is not a file name of the directory")
        if name not in self.listing:
            raise FileNotFoundError(errno.ENOENT, f"{self.directory}: {name} is missing", name)
        info = self.listing[name]
        self.files[name] = ObjectReader(self.storage, info.path, info.size, info.version)
        self.sizes[name] = info.size

    def vanished(self) -> bool:
        return not self.storage.isdir(self.directory)

    def close(self) -> None:
        for reader in self.files.values():
            reader.close()

    def __enter__(self) -> ObjectSnapshot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def fetch_object(call_s3: Callable[..., Awaitable[Any]], *, max_bytes: int | None = None,
                       **kwargs: Any) -> tuple[Mapping[str, Any], bytes | None]:
    """One ``GetObject`` (``call_s3("get_object", **kwargs)``) and its whole body, as one
    coroutine: one bound (`object_errors.run_bounded`) covers the request and the body. The body
    is None (not read) when the object is larger than ``max_bytes``."""
    response = await call_s3("get_object", **kwargs)
    async with response["Body"] as stream:
        if max_bytes is not None and int(response.get("ContentLength", 0)) > max_bytes:
            return response, None
        return response, await stream.read()


def stream_body(loop: Any, timeout: float, response: Mapping[str, Any], path: str, view: memoryview,
                on_piece: Callable[[memoryview], Any] | None) -> memoryview:
    """Streams the body of a ``GetObject`` answer into ``view`` as it arrives,
    `READ_PIECE_BYTES` at a time, calling ``on_piece`` on each piece; returns the filled part
    (shorter when the body ends first). Each piece is read on the client's event loop ``loop``
    within ``timeout`` seconds (`StorageTimeoutError` past it). The body is closed either way."""
    body, filled = response["Body"], 0
    try:
        while filled < view.nbytes:
            piece = view[filled:filled + READ_PIECE_BYTES]
            n = run_bounded(loop, timeout, _fill, body, piece, path=path, operation="get_object (body)")
            if not n:
                break
            if on_piece is not None:
                on_piece(piece[:n])
            filled += n
    finally:
        try:
            run_bounded(loop, timeout, body.aclose, path=path, operation="get_object (close)")
        except Exception as e:  # noqa: BLE001 - the read's own outcome is what counts
            logger.debug("could not close the body of a read of %s: %s", path, e)
    return view[:filled]


async def _fill(body: Any, view: memoryview) -> int:
    """Reads ``body`` into ``view`` until it is full or the body ends; returns the bytes read."""
    filled = 0
    while filled < view.nbytes:
        chunk = await body.read(view.nbytes - filled)
        if not chunk:
            break
        view[filled:filled + len(chunk)] = chunk
        filled += len(chunk)
    return filled


def split_url(path: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``."""
    rest = path.split("://", 1)[1] if "://" in path else path
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{path!r} names no bucket (expected s3://bucket/key)")
    return bucket, key


def key_prefix(key: str) -> str:
    """``key/`` (``""`` for the bucket's root): the prefix of the objects under ``key``."""
    key = key.strip("/")
    return f"{key}/" if key else ""


def mtime_of(response: Mapping[str, Any]) -> float:
    """The ``LastModified`` of a response in seconds since the epoch (0.0 when absent)."""
    modified = response.get("LastModified")
    return modified.timestamp() if hasattr(modified, "timestamp") else 0.0
