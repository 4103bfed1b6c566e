"""`ObjectStoreStorage`: the `Storage` of ``s3://`` logdirs, on fsspec's ``s3fs`` (SPEC §16).

Needs the optional extra ``pip install "torch-supervisor[s3]"``; `supervisor.checkpoint.storage`
imports this module only when an ``s3://`` URL is used. `ObjectStoreStorage.from_url` imports no
client: s3fs/botocore (~0.4 s) are imported by the first request, e.g. in a tiered manager's persist worker.

Every request goes through the real botocore client that ``s3fs`` holds (its ``_call_s3``
coroutine, run on s3fs's event loop within ``request_timeout``: `ObjectStoreStorage.request`), so
the conditional writes are the server's: create-only ``If-None-Match: *`` (`create_exclusive`, the
manifest-last commit) and ``If-Match: <ETag>`` (`replace_if`, the index). A refused condition
(HTTP 412) is `PreconditionFailedError` (`ObjectExistsError` for a create-only write); the
translation of every other error is `supervisor.checkpoint.storage.s3.errors.translate_error`. No
request waits past ``request_timeout`` (`supervisor.checkpoint.storage.s3.errors.StorageTimeoutError`).

Configuration (credentials, endpoint, bounded retries, timeouts, and this module's transfer
knobs ``part_size``, ``max_concurrency``, ``min_range_size``, ``multipart_checksum``,
``request_timeout``): see `supervisor.checkpoint.storage.s3.config`.
"""
from __future__ import annotations

import dataclasses
import errno
import functools
import importlib.util
import io
import logging
import posixpath
import threading
import time
from typing import IO, Any, Callable, Iterable, Mapping

from supervisor.checkpoint.storage.fileio import crc32, format_checksum
from supervisor.checkpoint.storage.base import MANIFEST_FILE
from supervisor.checkpoint.storage.s3.errors import ConflictError, StorageTimeoutError, run_bounded
from supervisor.checkpoint.storage.s3.objects import (MultipartWriter, ObjectReader, ObjectSnapshot, fetch_object, key_prefix,
                                                   mtime_of, split_url, stream_body)
from supervisor.checkpoint.storage.s3.config import (DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_CONCURRENCY, DEFAULT_MIN_RANGE_SIZE,
                                                  DEFAULT_MULTIPART_CHECKSUM, DEFAULT_PART_SIZE,
                                                  DEFAULT_REQUEST_TIMEOUT, TransferKnobs, default_options,
                                                  make_filesystem, split_options)
from supervisor.checkpoint.storage.s3.uploads import abort_uploads
from supervisor.checkpoint.storage.base import ObjectExistsError, ObjectInfo, PreconditionFailedError, Storage

__all__ = ["ObjectStoreStorage", "DEFAULT_PART_SIZE", "DEFAULT_MAX_CONCURRENCY", "DEFAULT_MAX_ATTEMPTS",
           "DEFAULT_MIN_RANGE_SIZE", "DEFAULT_MULTIPART_CHECKSUM", "default_options"]

logger = logging.getLogger(__name__)

_CONFLICT_RETRIES = 3  # 409 ConditionalRequestConflict: S3 asks to retry a conditional write


class ObjectStoreStorage(Storage):
    """`supervisor.checkpoint.storage.Storage` on an S3-compatible object store.

    Args:
        fs: an ``s3fs.S3FileSystem``; or ``make_fs``: a function making one at the first use of `fs`.
        part_size: bytes per multipart part (≥ 5 MiB for S3).
        max_concurrency: parts uploaded, and ranges read, in parallel per file.
        min_range_size: the smallest range of a whole-object read (the module docstring).
        multipart_checksum: the ``ChecksumAlgorithm`` of multipart uploads (the module
            docstring); None sends none.
        request_timeout: the seconds one request may take end to end (`request`).
    """

    scheme = "s3"
    #: No rename: a checkpoint is written at its final prefix and exists once its manifest does.
    kind = "object"

    def __init__(self, fs: Any = None, *, part_size: int = DEFAULT_PART_SIZE,
                 max_concurrency: int = DEFAULT_MAX_CONCURRENCY, min_range_size: int = DEFAULT_MIN_RANGE_SIZE,
                 multipart_checksum: str | None = DEFAULT_MULTIPART_CHECKSUM,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT, make_fs: Callable[[], Any] | None = None) -> None:
        knobs = TransferKnobs(part_size, max_concurrency, min_range_size, multipart_checksum, request_timeout)  # checked
        if (fs is None) == (make_fs is None):
            raise TypeError("ObjectStoreStorage takes an s3fs.S3FileSystem (fs) or a function making one (make_fs)")
        self._fs, self._make_fs, self._fs_lock = fs, make_fs, threading.Lock()
        self.part_size, self.max_concurrency = knobs.part_size, knobs.max_concurrency
        self.min_range_size, self.multipart_checksum = knobs.min_range_size, knobs.multipart_checksum
        self.request_timeout = knobs.request_timeout
        self._connected = False
        self._timed_out_at = -float("inf")  # time.monotonic() of the last request that timed out

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> ObjectStoreStorage:
        """A storage for ``url`` (only its scheme matters; paths stay full URLs): the extra's
        presence (ImportError) and the options (`split_options`) checked now, the client made
        on first use (the module docstring)."""
        if importlib.util.find_spec("s3fs") is None:
            raise ImportError("No module named 's3fs'", name="s3fs")
        options, knobs, s3fs_retries = split_options(storage_options)
        return cls(make_fs=functools.partial(make_filesystem, options, s3fs_retries), **dataclasses.asdict(knobs))

    @property
    def fs(self) -> Any:
        """The ``s3fs.S3FileSystem``, made on first use when `from_url` made the storage."""
        with self._fs_lock:
            if self._fs is None:
                self._fs = self._make_fs()
            return self._fs

    @property
    def _call_s3(self) -> Any:  # s3fs's request coroutine (fsspec names a method's async twin _<name>)
        fs = self.fs  # s3fs's object: its public coroutine, not a private attribute of ours
        return fs._call_s3

    # ------------------------------------------------------------ names
    def join(self, base: str, *parts: str) -> str:
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts if p)])

    def dirname(self, path: str) -> str:
        bucket, key = split_url(path)
        return f"s3://{bucket}/{posixpath.dirname(key.rstrip('/'))}".rstrip("/")

    def basename(self, path: str) -> str:
        return posixpath.basename(path.rstrip("/"))

    def makedirs(self, path: str) -> None:
        """Nothing to do: an object store has no directories (a prefix exists with its objects)."""

    # ------------------------------------------------------------ requests
    def request(self, method: str, where: str, **kwargs: Any) -> Any:
        """The one way a request reaches the store: s3fs's ``_call_s3(method, **kwargs)`` on its
        event loop, abandoned after ``request_timeout`` (`StorageTimeoutError` naming
        ``method``, ``where`` and the bound), other errors translated (`translate_error`)."""
        try:
            return run_bounded(self._loop(), self.request_timeout, self._call_s3, method, path=where,
                               operation=method, **kwargs)
        except StorageTimeoutError:
            self._timed_out_at = time.monotonic()
            raise

    def silent(self) -> bool:
        """Whether a request timed out within the last ``request_timeout``: then clean-ups that
        can wait for the next writer (a failed save's objects, its unfinished upload) are left
        to it instead of waiting another bound each on a store that does not answer."""
        return time.monotonic() - self._timed_out_at < self.request_timeout

    def _loop(self) -> Any:
        """s3fs's event loop, its client made first: creating it is local work (botocore loads
        its service model: seconds on a busy machine), not part of a request's bound."""
        if not self._connected:
            self.fs.connect()
            self._connected = True
        return self.fs.loop

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """`request` ``(method, Bucket=..., Key=..., **kwargs)`` of the object ``path``."""
        bucket, key = split_url(path)
        return self.request(method, path, Bucket=bucket, Key=key, **kwargs)

    def _put(self, path: str, data: bytes, **conditions: str) -> ObjectInfo:
        for attempt in range(_CONFLICT_RETRIES):
            try:
                body = data if isinstance(data, (bytes, bytearray)) else bytes(data)
                response = self.call("put_object", path, Body=body, **conditions)
                return ObjectInfo(path=path, size=len(data), version=response["ETag"], mtime=0.0)
            except ConflictError:
                if attempt == _CONFLICT_RETRIES - 1:
                    raise
                time.sleep(0.05 * 2 ** attempt)
        raise AssertionError("unreachable")

    def write_atomic(self, path: str, data: bytes) -> ObjectInfo:
        """One ``PutObject``: readers see the old object or the new one."""
        return self._put(path, data)

    def create_exclusive(self, path: str, data: bytes) -> ObjectInfo:
        """``PutObject`` with ``If-None-Match: *``; `ObjectExistsError` when it exists."""
        try:
            return self._put(path, data, IfNoneMatch="*")
        except PreconditionFailedError as e:
            raise ObjectExistsError(f"{path} already exists: the create-only write (If-None-Match: *) was "
                                    "refused") from e

    def replace_if(self, path: str, data: bytes, version: str) -> ObjectInfo:
        """``PutObject`` with ``If-Match: <version>``: `PreconditionFailedError` when another
        writer replaced it since, ``FileNotFoundError`` when it is gone. Atomic on the server."""
        return self._put(path, data, IfMatch=version)

    def open_write(self, path: str) -> MultipartWriter:
        return MultipartWriter(self, path)

    # ------------------------------------------------------------ reading
    def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return self.read_versioned(path, max_bytes=max_bytes)[0]

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, ObjectInfo]:
        """The whole object and its ETag, from one ``GetObject`` (request and body within one
        ``request_timeout``)."""
        response, data = self._get(path, max_bytes=max_bytes)
        if data is None:
            raise OSError(errno.EFBIG, f"{path} has {response.get('ContentLength')} bytes, more than the {max_bytes} "
                          "expected")
        return data, ObjectInfo(path=path, size=len(data), version=response["ETag"], mtime=mtime_of(response))

    def _get(self, path: str, **kwargs: Any) -> tuple[Mapping[str, Any], bytes | None]:
        bucket, key = split_url(path)
        try:
            return run_bounded(self._loop(), self.request_timeout, fetch_object, self._call_s3, path=path,
                               operation="get_object", Bucket=bucket, Key=key, **kwargs)
        except StorageTimeoutError:
            self._timed_out_at = time.monotonic()
            raise

    def read_range(self, path: str, start: int, length: int, *, if_match: str | None = None,
                   into: Any = None, on_piece: Callable[[memoryview], Any] | None = None) -> Any:
        """Bytes ``[start, start + length)`` with one ranged ``GetObject`` (fewer at the end);
        with ``if_match`` (an ETag) only from that version (`PreconditionFailedError` if not).

        With ``into`` (a writable buffer of at least ``length`` bytes) the body is streamed into
        it as it arrives, ``object_io.READ_PIECE_BYTES`` at a time, ``on_piece(piece)`` called on each piece
        (a CRC computed on arrival), and ``into``'s filled part is returned (a ``memoryview``):
        no intermediate copy of the range, whatever its size (each piece within
        ``request_timeout``); without it the request and the body are one bounded wait."""
        if length <= 0:
            return b"" if into is None else memoryview(into)[:0]
        conditions = {"IfMatch": if_match} if if_match else {}
        ranged = {"Range": f"bytes={start}-{start + length - 1}", **conditions}
        if into is None:
            return self._get(path, **ranged)[1]
        response = self.call("get_object", path, **ranged)
        return stream_body(self.fs.loop, self.request_timeout, response, path, memoryview(into).cast("B")[:length],
                           on_piece)

    def open_read(self, path: str) -> IO[bytes]:
        """A seekable read-only file of the version `stat` sees: buffered ranged ``GetObject``
        requests with ``If-Match`` on its ETag, each bounded like every request."""
        info = self.stat(path)  # FileNotFoundError / IsADirectoryError in our terms first
        return io.BufferedReader(ObjectReader(self, path, info.size, info.version), buffer_size=1 << 20)

    def open_snapshot(self, directory: str, names: Iterable[str]) -> ObjectSnapshot:
        """Lists ``directory/`` once (sizes and ETags) and returns readers of ``names`` that
        read only those versions (see `supervisor.checkpoint.storage.base.Snapshot`)."""
        return ObjectSnapshot(self, directory, self.list_objects(directory), names)

    def stat(self, path: str) -> ObjectInfo:
        try:
            response = self.call("head_object", path)
        except FileNotFoundError:
            if self.isdir(path):
                raise IsADirectoryError(errno.EISDIR, f"{path} is a prefix (a directory), not an object") from None
            raise
        return ObjectInfo(path=path, size=int(response["ContentLength"]), version=response["ETag"],
                          mtime=mtime_of(response))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except (FileNotFoundError, IsADirectoryError) as e:
            return isinstance(e, IsADirectoryError)
        return True

    def isdir(self, path: str) -> bool:
        bucket, key = split_url(path)
        page = self._list_page(bucket, key_prefix(key), MaxKeys=1)
        return bool(page.get("KeyCount", 0))

    def listdir(self, path: str) -> list[str]:
        """Sorted names directly under the prefix ``path/`` (objects and sub-prefixes);
        ``[]`` when nothing is there (a missing "directory" lists as empty)."""
        bucket, key = split_url(path)
        prefix = key_prefix(key)
        names: set[str] = set()
        for page in self._pages(bucket, prefix, Delimiter="/"):
            names.update(c["Prefix"][len(prefix):].rstrip("/") for c in page.get("CommonPrefixes", ()))
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", ()))
        names.discard("")
        return sorted(names)

    def list_files(self, path: str) -> list[str]:
        """Every object under ``path/``, as sorted relative keys."""
        return sorted(self.list_objects(path))

    def list_objects(self, path: str) -> dict[str, ObjectInfo]:
        """Every object under ``path/`` (relative key → size, ETag, mtime), from the listing."""
        bucket, key = split_url(path)
        prefix = key_prefix(key)
        return {o["Key"][len(prefix):]: ObjectInfo(path=f"s3://{bucket}/{o['Key']}", size=int(o["Size"]),
                                                   version=o["ETag"], mtime=mtime_of({"LastModified": o.get("LastModified")}))
                for page in self._pages(bucket, prefix) for o in page.get("Contents", ())}

    def _pages(self, bucket: str, prefix: str, **kwargs: Any) -> Any:
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._list_page(bucket, prefix, **kwargs, **extra)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _list_page(self, bucket: str, prefix: str, **kwargs: Any) -> Mapping[str, Any]:
        return self.request("list_objects_v2", f"s3://{bucket}/{prefix}", Bucket=bucket, Prefix=prefix, **kwargs)

    # ------------------------------------------------------------ removing
    def remove(self, path: str) -> bool:
        """Deletes one object; False when it was already gone (S3's delete does not say: one
        ``HeadObject`` first)."""
        try:
            self.call("head_object", path)
        except FileNotFoundError:
            return False
        self.call("delete_object", path)
        return True

    def remove_tree(self, path: str) -> None:
        """Deletes every object under ``path/`` (``DeleteObjects``, 1000 a request); what the
        server refuses is logged, not raised."""
        bucket, key = split_url(path)
        keys = [key_prefix(key) + rel for rel in self.list_files(path)]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            try:
                response = self.request("delete_objects", path, Bucket=bucket,
                                        Delete={"Objects": batch, "Quiet": True})
            except OSError as e:
                logger.warning("could not remove objects under %s: %s", path, e)
                continue
            for error in response.get("Errors", ()):
                logger.warning("could not remove s3://%s/%s: %s", bucket, error.get("Key"), error.get("Message"))

    def abort_uploads(self, path: str, accept: Callable[[str], bool]) -> list[str]:
        """Aborts the unfinished multipart uploads under ``path/`` (`object_uploads.abort_uploads`)."""
        return abort_uploads(self, path, accept)

    # ------------------------------------------------------------ the directory commit
    def stage(self, directory: str, name: str) -> str:
        """Returns ``<directory>/<name>``: the data objects go straight to their final keys and
        the manifest, written last by `commit`, makes them a checkpoint. ``FileExistsError`` if
        that checkpoint is committed already (`Storage.uncommit` it first: writing in place
        would overwrite the objects its manifest vouches for); manifest-less leftovers of an
        interrupted write are removed with a WARNING. Exports commit this way; checkpoints are
        staged under a root of their save instead (`supervisor.checkpoint.layout.fencing`)."""
        final = self.join(directory, name)
        if self.exists(self.join(final, MANIFEST_FILE)):
            raise FileExistsError(errno.EEXIST, f"{final} is a committed checkpoint; remove it before saving "
                                  "the same step again")
        if self.isdir(final):
            logger.warning("removing %s left behind by an interrupted checkpoint write (no %s)", final, MANIFEST_FILE)
            self.remove_tree(final)
        return final

    def commit(self, staged: str, final: str, *, manifest_name: str, manifest: bytes) -> None:
        """Writes the manifest last, create-only: the checkpoint exists from that instant."""
        if staged.rstrip("/") != final.rstrip("/"):
            raise ValueError(f"an object store commits in place: staged {staged!r} must be final {final!r}")
        self.create_exclusive(self.join(final, manifest_name), manifest)

    def discard(self, staged: str) -> None:
        """Removes a staged checkpoint's objects — never a committed one's. Not while the store is
        `silent`: the next writer opening the logdir removes a prefix without a manifest."""
        if self.silent():
            logger.warning("not removing the unfinished checkpoint %s now: a request to the store timed out within "
                           "request_timeout=%g s; the next writer opening the logdir removes it", staged,
                           self.request_timeout)
            return
        if self.exists(self.join(staged, MANIFEST_FILE)):
            logger.warning("not discarding %s: it holds a %s (committed)", staged, MANIFEST_FILE)
            return
        self.remove_tree(staged)

    def uncommit(self, final: str) -> str | None:
        """Deletes the manifest of the committed ``final`` (one request: from then on it is not a
        checkpoint) and returns ``final`` for `remove_tree`; None when it holds no manifest.
        A crash before its objects are removed leaves a manifest-less prefix, which a writer
        opening the logdir removes with a WARNING."""
        return final if self.remove(self.join(final, MANIFEST_FILE)) else None

    # ------------------------------------------------------------ the rest of the write path
    def entry_kind(self, path: str) -> str | None:
        """``"dir"`` for a prefix holding objects, ``"file"`` for an object, None for nothing
        (an object store has no links, FIFOs or devices)."""
        if self.isdir(path):
            return "dir"
        try:
            self.call("head_object", path)
        except FileNotFoundError:
            return None
        return "file"

    def checksum(self, path: str) -> tuple[int, str]:
        """Size and CRC-32 of an object, streamed once (an object is durable once it exists)."""
        crc = size = 0
        with self.open_read(path) as f:
            while chunk := f.read(self.part_size):
                crc = crc32(chunk, crc)
                size += len(chunk)
        return size, format_checksum(crc)

    def rename(self, src: str, dst: str) -> None:
        """An object store has no rename (a copy and a delete would not be atomic)."""
        raise OSError(errno.ENOTSUP, f"an object store has no rename ({src} -> {dst})")

    def sync_dir(self, path: str) -> None:
        """Nothing to do: an object is durable once its write returned."""

