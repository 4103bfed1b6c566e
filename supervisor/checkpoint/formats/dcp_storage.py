"""``torch.distributed.checkpoint`` over the storage seam: sharded checkpoints on object stores
(``checkpoint_format="dcp"`` with an ``s3://`` logdir, SPEC §12, §16).

`StorageDcpWriter` and `StorageDcpReader` are DCP's own ``FileSystemWriter``/``FileSystemReader``
(its planning, file layout — ``__<rank>_<n>.distcp`` shards, ``.metadata`` — and serialisation,
unchanged) with their file system swapped for `StorageFileSystem`, which reads and writes
through a `supervisor.checkpoint.storage.Storage`. Why not DCP's ``FsspecWriter``/``FsspecReader``:

* a shard is uploaded by `Storage.open_write` (multipart, parts in parallel, create-only
  completion), its size and CRC-32 computed while it is written — the manifest's records with no
  second read (`StorageDcpWriter.records`); fsspec's writer offers no checksum;
* DCP writes ``.metadata`` to a temp name and renames it, which an object store cannot do (s3fs
  copies and deletes): here it is kept in memory and uploaded once, create-only, under its name;
* the same client, retries and timeouts as every other request of the logdir (one
  ``storage_options``), and every request's errors translated the same way;
* reading: the objects are listed once (`Storage.open_snapshot`) and read by ranged
  ``GetObject`` requests with ``If-Match`` on the listed ETag, in parallel, so a restore reads
  only the byte ranges its rank needs (resharding included; near ranges coalesced), all from the
  versions the manifest vouches for.

Nothing here decides what is committed: the caller (`supervisor.checkpoint.sharded.commit`) collects
every rank's records and the chief writes ``MANIFEST.json`` last.
"""
from __future__ import annotations

import contextlib
import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Iterator

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from supervisor.checkpoint.formats.dcp_ranges import ItemChecksums, check_item
from supervisor.checkpoint.formats.dcp_replicated import serve_shared
from supervisor.checkpoint.layout.format import FileRecord
from supervisor.checkpoint.storage import Storage

__all__ = ["COALESCE_GAP", "StorageDcpReader", "StorageDcpWriter", "StorageFileSystem", "wanted_ranges"]

#: DCP writes a file under this suffix and renames it (its ``.metadata``): kept in memory here.
_TEMP_SUFFIX = ".tmp"
#: Byte ranges of one file closer than this are read as one (fewer requests, a little more data).
COALESCE_GAP = 1 << 20


class _UploadStream(io.RawIOBase):
    """The stream DCP writes one file into: a `Storage.open_write` writer (``tell`` is the bytes
    written: DCP records each item's offset with it). The file appears whole when the stream
    ends without an error (`StorageFileSystem.create_stream`), never otherwise."""

    def __init__(self, writer: Any) -> None:
        super().__init__()
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self.writer.write(data)

    def tell(self) -> int:
        return self.writer.nbytes


class StorageFileSystem(FileSystemBase):
    """DCP's file-system interface over a `Storage` (paths in the storage's spelling).

    Every file written is recorded in `records` (name relative to `root` -> size and CRC-32,
    computed while writing). A file DCP writes under a ``.tmp`` name and then renames (its
    ``.metadata``) is held in memory and uploaded once, create-only, by the rename. Reading
    (``"rb"``) goes through one listing of `root` taken at the first open: ranged reads of the
    listed versions only.
    """

    def __init__(self, storage: Storage, root: str) -> None:
        self.storage = storage
        self.root = root.rstrip("/")
        self.records: dict[str, FileRecord] = {}
        self._pending: dict[str, bytes] = {}
        self._snapshot: Any = None
        self._mutex = threading.Lock()

    def _relative(self, path: str | os.PathLike) -> str:
        text = os.fspath(path)
        prefix = self.root + "/"
        if not text.startswith(prefix):
            raise ValueError(f"{text} is not inside the checkpoint {self.root}")
        return text[len(prefix):]

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        name = self._relative(path)
        if mode == "rb":
            yield self._reader(name)
        elif mode != "wb":
            raise ValueError(f"{path}: mode {mode!r} is not supported (only 'wb' and 'rb')")
        elif name.endswith(_TEMP_SUFFIX):
            buffer = io.BytesIO()
            yield buffer
            with self._mutex:
                self._pending[name] = buffer.getvalue()
        else:
            with self.storage.open_write(self.storage.join(self.root, name)) as writer:
                yield _UploadStream(writer)  # type: ignore[misc]
                writer.sync()  # only when DCP's writing ended without an error: else aborted
                self._record(name, writer)

    def _record(self, name: str, writer: Any) -> None:
        with self._mutex:
            self.records[name] = FileRecord(writer.nbytes, writer.checksum)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        """Uploads a file held in memory under its final name (create-only); an object store has
        no other rename."""
        name, final = self._relative(path), self._relative(new_path)
        with self._mutex:
            data = self._pending.pop(name, None)
        if data is None:
            raise OSError(f"cannot rename {path}: an object store has no rename (only a file written "
                          f"under a {_TEMP_SUFFIX} name through this file system can be)")
        with self.storage.open_write(self.storage.join(self.root, final)) as writer:
            writer.write(data)
            writer.sync()
            self._record(final, writer)

    def _reader(self, name: str) -> Any:
        with self._mutex:
            if self._snapshot is None:
                self._snapshot = self.storage.open_snapshot(self.root, [])
            if name not in self._snapshot.files:
                self._snapshot.open(name)
            return self._snapshot.files[name]

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return self.storage.join(os.fspath(path), suffix)

    def init_path(self, path: str | os.PathLike) -> str:
        return os.fspath(path).rstrip("/")

    def mkdir(self, path: str | os.PathLike) -> None:
        """Nothing to do: an object store has no directories."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return "://" in os.fspath(checkpoint_id)

    def exists(self, path: str | os.PathLike) -> bool:
        name = self._relative(path)
        with self._mutex:
            if name in self._pending or name in self.records:
                return True
        return self.storage.exists(os.fspath(path))

    def rm_file(self, path: str | os.PathLike) -> None:
        self.storage.remove(os.fspath(path))

    def close(self) -> None:
        with self._mutex:
            snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            snapshot.close()


class StorageDcpWriter(ItemChecksums, FileSystemWriter):
    """DCP's ``FileSystemWriter`` writing through ``storage`` into the checkpoint prefix
    ``path`` (see the module docstring). `records` holds the size and CRC-32 of every file this
    process wrote (its shards; on the coordinator also ``.metadata``); each item's CRC-32 goes
    into ``.metadata`` (`supervisor.checkpoint.formats.dcp_ranges`). DCP's fsync is off: a file is
    durable once its upload completed (`Storage.open_write`'s ``sync``)."""

    def __init__(self, storage: Storage, path: str) -> None:
        super().__init__(path, sync_files=False)
        self.fs = StorageFileSystem(storage, path)  # type: ignore[assignment]
        self.path = self.fs.init_path(path)
        self.record_items()

    @property
    def records(self) -> dict[str, FileRecord]:
        return dict(self.fs.records)  # type: ignore[attr-defined]

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return StorageFileSystem.validate_checkpoint_id(checkpoint_id)


class StorageDcpReader(FileSystemReader):
    """DCP's ``FileSystemReader`` reading the checkpoint prefix ``path`` through ``storage``,
    from the versions listed when the first file was opened. Before a file's items are loaded,
    the byte ranges this process needs of it (its part of the shards: resharding reads parts of
    several files) are fetched with ranged reads in parallel, ranges closer than
    `COALESCE_GAP` merged and split into ``storage.part_size`` pieces: a few large requests
    instead of one per tensor, and never the items another rank needs. ``metadata``: the
    checkpoint's DCP metadata, already read (allowlisted: see `supervisor.checkpoint.formats.dcp_reading`);
    DCP's own unrestricted unpickling is never used."""

    def __init__(self, storage: Storage, path: str, metadata: Any, items: Any = None) -> None:
        super().__init__(path)
        self.fs = StorageFileSystem(storage, path)  # type: ignore[assignment]
        self.path = self.fs.init_path(path)
        self._metadata = metadata
        self._items = items  # already read and checked (`dcp_replicated.serve_shared`)
        self._part_size, self._threads = int(storage.part_size), int(storage.max_concurrency)
        self._wanted: dict[str, list[tuple[int, int]]] = {}
        self._fetched: tuple[str | None, list[tuple[int, bytes]]] = (None, [])

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        return self._metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        plan = serve_shared(self, plan, planner, self._items)
        self._wanted = wanted_ranges(self.storage_data[item.storage_index] for item in plan.items)
        try:
            return super().read_data(plan, planner)
        finally:
            self._wanted, self._fetched = {}, (None, [])  # DCP reads a file's items together: one at a time

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        read_at = getattr(file, "read_at", None)
        if read_at is None:
            return super()._slice_file(file, sinfo)
        name, blocks = self._fetched
        if name != sinfo.relative_path:
            name = sinfo.relative_path
            blocks = self._fetch(read_at, self._wanted.get(name, []))
            self._fetched = (name, blocks)
        data = _cut(blocks, sinfo.offset, sinfo.length)
        if data is None:  # not planned ahead (DCP asked for more than its plan): one ranged read
            data = read_at(sinfo.offset, sinfo.length)
        if len(data) != sinfo.length:
            raise OSError(f"{self.path}/{sinfo.relative_path}: the object ends after {len(data)} of the "
                          f"{sinfo.length} bytes an item at offset {sinfo.offset} needs (truncated)")
        check_item(data, sinfo, self.path)
        return io.BytesIO(data)

    def _fetch(self, read_at: Any, ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
        """The bytes of ``ranges`` (start, end), in ``part_size`` pieces fetched in parallel."""
        pieces = [(p, min(p + self._part_size, end)) for start, end in ranges
                  for p in range(start, end, self._part_size)]
        if not pieces:
            return []
        with ThreadPoolExecutor(min(self._threads, len(pieces)), thread_name_prefix="supervisor-dcp-read") as pool:
            data = list(pool.map(lambda piece: read_at(piece[0], piece[1] - piece[0]), pieces))
        blocks: list[tuple[int, bytes]] = []
        for start, end in ranges:
            parts = [d for (p, _), d in zip(pieces, data) if start <= p < end]
            blocks.append((start, b"".join(parts)))
        return blocks

    def close(self) -> None:
        self.fs.close()  # type: ignore[attr-defined]

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return StorageFileSystem.validate_checkpoint_id(checkpoint_id)


def wanted_ranges(infos: Iterable[Any]) -> dict[str, list[tuple[int, int]]]:
    """Per file (``relative_path`` of DCP's storage infos), the sorted byte ranges ``(start,
    end)`` the items cover, those closer than `COALESCE_GAP` merged into one."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for info in infos:
        spans.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
    merged: dict[str, list[tuple[int, int]]] = {}
    for name, ranges in spans.items():
        out: list[tuple[int, int]] = []
        for start, end in sorted(ranges):
            if out and start - out[-1][1] <= COALESCE_GAP:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[name] = out
    return merged


def _cut(blocks: list[tuple[int, bytes]], offset: int, length: int) -> bytes | None:
    for start, data in blocks:
        if start <= offset and offset + length <= start + len(data):
            return data[offset - start:offset - start + length]
    return None
