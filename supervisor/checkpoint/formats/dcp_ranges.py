"""Checksums of a sharded checkpoint's byte ranges (issue 31): saved while writing, checked by
each rank on exactly the ranges it reads.

DCP writes each rank's items (a tensor shard, or a pickled object) one after another into its
``__<rank>_<n>.distcp`` files and records where each lies (``_StorageInfo``: file, offset,
length) in the checkpoint's ``.metadata``. At a save, `ItemChecksums` (mixed into DCP's
``FileSystemWriter``, locally and on an object store) passes every byte written through
`_Segments`, which computes the CRC-32 of the whole file (the manifest's record: no second
read of a fresh shard) and of each stretch between two ``tell()`` calls — DCP asks for the
position at the start and the end of every item, so each item's CRC-32 comes out whole. That
CRC is kept on the item's ``_StorageInfo`` as one more attribute (`ITEM_CRC`), so it travels
in DCP's own ``.metadata`` (pickled as the info's ``__dict__``; DCP itself ignores it), which
the manifest checksums. At a restore, `check_item` verifies each item a rank reads against it:
a rank reads and verifies only its own ranges, and a damaged shard is still caught, by the rank
that reads the damaged item, before anything is loaded from it.

Checkpoints written before (no `ITEM_CRC` on their items) are verified whole by the chief
before any rank loads, as they were (`verifiable_by_ranges` says which).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from supervisor.checkpoint.storage.fileio import crc32, crc32_combine, format_checksum
from supervisor.checkpoint.layout.format import FileRecord
from supervisor.errors import CheckpointCorruptError

__all__ = ["ITEM_CRC", "ItemChecksums", "check_item", "verifiable_by_ranges"]

#: The attribute of DCP's ``_StorageInfo`` holding the CRC-32 of the item's bytes.
ITEM_CRC = "supervisor_crc32"


class _Segments:
    """A write-only stream in front of the one DCP writes a file through: the CRC-32 of the
    whole file, and of each stretch between two ``tell()`` calls (``cuts``: start, length, crc)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.size = self.crc = 0
        self._start = self._crc = 0
        self.cuts: list[tuple[int, int, int]] = []

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self._stream.write(view)
        n = len(view) if n is None else n
        self.crc = crc32(view[:n], self.crc)
        self._crc = crc32(view[:n], self._crc)
        self.size += n
        return n

    def tell(self) -> int:
        self.cut()
        return self.size

    def cut(self) -> None:
        if self.size > self._start:
            self.cuts.append((self._start, self.size - self._start, self._crc))
        self._start, self._crc = self.size, 0

    def __getattr__(self, name: str) -> Any:  # flush, fileno (DCP's fsync), ...
        return getattr(self._stream, name)


class _RecordingFileSystem:
    """DCP's file system with every file opened for writing passed through `_Segments`."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.written: dict[str, _Segments] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with self._fs.create_stream(path, mode) as stream:
            if mode != "wb":
                yield stream
                return
            segments = _Segments(stream)
            yield segments
            segments.cut()
        self.written[os.path.basename(os.fspath(path).rstrip("/"))] = segments

    def item_crc(self, name: str, offset: int, length: int) -> int | None:
        """The CRC-32 of ``length`` bytes at ``offset`` of the file ``name`` as written; None when
        no stretch starts there (the item is then verified with its whole file)."""
        segments = self.written.get(name)
        if segments is None:
            return None
        crc, at = None, offset
        for start, size, value in segments.cuts:
            if start == at and at < offset + length:
                crc = value if crc is None else crc32_combine(crc, value, size)
                at += size
        return crc if at == offset + length else None


class ItemChecksums:
    """Mixed into a DCP ``FileSystemWriter`` (before it): records the CRC-32 of every item it
    writes on the item's ``_StorageInfo`` (`ITEM_CRC`), and `file_records` — the size and CRC-32
    of every file written, computed on the way (no read back)."""

    def record_items(self) -> None:
        """Call once the writer's ``fs`` is set."""
        self.fs = _RecordingFileSystem(self.fs)  # type: ignore[has-type]

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)  # type: ignore[misc]
        for result in future.wait():
            info = result.storage_data
            crc = self.fs.item_crc(info.relative_path, info.offset, info.length)
            if crc is not None:
                setattr(info, ITEM_CRC, crc)
        return future

    def file_records(self, prefix: str = "") -> dict[str, FileRecord]:
        return {name: FileRecord(s.size, format_checksum(s.crc)) for name, s in self.fs.written.items()
                if name.startswith(prefix)}


def verifiable_by_ranges(metadata: Any) -> bool:
    """Whether every item of DCP ``metadata`` has its CRC-32 (`ITEM_CRC`): then each rank
    verifies what it reads, and nobody needs to read the checkpoint whole first."""
    infos = list((getattr(metadata, "storage_data", None) or {}).values())
    return bool(infos) and all(isinstance(getattr(info, ITEM_CRC, None), int) for info in infos)


def check_item(data: bytes | bytearray | memoryview, info: Any, where: str) -> None:
    """Checks the bytes read of one item against its `ITEM_CRC` (nothing to check without one).

    Raises:
        CheckpointCorruptError: the bytes differ; names the file and the range.
    """
    expected = getattr(info, ITEM_CRC, None)
    if expected is None:
        return
    end = info.offset + info.length
    if len(data) != info.length:
        raise CheckpointCorruptError(f"{where}: {info.relative_path} ends inside bytes {info.offset}-{end} "
                                     f"({len(data)} of {info.length} read): truncated")
    crc = crc32(data)
    if crc != expected:
        raise CheckpointCorruptError(
            f"{where}: bytes {info.offset}-{end} of {info.relative_path} (one item) have checksum "
            f"{format_checksum(crc)}, the checkpoint's metadata says {format_checksum(expected)} (the shard is "
            "damaged)")
