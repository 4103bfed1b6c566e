"""Moving a rank's part between two ranks over a gloo group (SPEC §17, issue 33: peer replicas).

A `Link` is this rank's two point-to-point directions on a group of its own: what it sends goes
to ``send_to``, what it receives comes from ``recv_from`` (either None: that direction is idle).
`exchange_part` sends one committed part and receives another in the same pass: first each
side's header (the part's manifest: step, wall time, world size, each file's size and CRC-32),
then the files in chunks of `CHUNK_BYTES`, a send and a receive in flight together at each
index, so a ring of ranks (each sending to the next node's rank and receiving from the previous)
never waits on itself. Both sides know every size from the headers: the chunks always match, a
failed write on the receiver still drains what is sent, and nothing is ever half agreed.

The receiver stages the files with the local commit protocol (`TempCheckpoint`: CRC-32 while
written, fsync, manifest last, rename) and compares each file's size and CRC-32 with the
sender's manifest: a part that arrives damaged is discarded, never committed. A kill on either
side leaves at most a ``.tmp-`` directory, which the next open removes.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterator

import torch

from supervisor.checkpoint.layout.format import FileRecord, read_manifest
from supervisor.checkpoint.save.temp import TempCheckpoint
from supervisor.checkpoint.storage import Storage
from supervisor.errors import CheckpointCorruptError

__all__ = ["CHUNK_BYTES", "Link", "exchange_part", "header_of"]

logger = logging.getLogger(__name__)

#: How much of a file travels (and is in memory) at once.
CHUNK_BYTES = 8 << 20


class Link:
    """This rank's directions on ``group``: to ``send_to``, from ``recv_from`` (global ranks; None: idle)."""

    def __init__(self, group: Any, send_to: int | None, recv_from: int | None) -> None:
        self.group, self.send_to, self.recv_from = group, send_to, recv_from
        self.sent = self.received = 0  # bytes, for the figures

    def swap(self, out: torch.Tensor | None, into: torch.Tensor | None) -> None:
        """Sends ``out`` and receives into ``into`` (each when given and its direction is not idle), both in flight."""
        import torch.distributed as dist

        works = []
        if out is not None and self.send_to is not None:
            works.append(dist.isend(out, self.send_to, group=self.group))
            self.sent += out.numel() * out.element_size()
        if into is not None and self.recv_from is not None:
            works.append(dist.irecv(into, self.recv_from, group=self.group))
            self.received += into.numel() * into.element_size()
        for work in works:
            work.wait()

    def swap_int(self, value: int) -> int:
        """Sends ``value``, returns the one received (-1 when the receiving direction is idle)."""
        into = torch.full((1,), -1, dtype=torch.int64)
        self.swap(torch.tensor([value], dtype=torch.int64), into)
        return int(into.item())

    def swap_bytes(self, data: bytes) -> bytes:
        """Sends ``data``, returns what was received (its length first)."""
        size = self.swap_int(len(data))
        into = torch.empty(max(size, 0), dtype=torch.uint8)
        out = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
        self.swap(out, into if size > 0 else None)
        return into.numpy().tobytes() if size > 0 else b""


def header_of(part: str | None, storage: Storage) -> dict | None:
    """What `exchange_part` announces of ``part`` (its manifest), or None (no part, or unreadable)."""
    if part is None:
        return None
    try:
        manifest = read_manifest(part, storage)
    except Exception as e:  # noqa: BLE001 - announced as nothing; the receiver has no replica of it
        logger.warning("cannot send the part %s to its peer: %s", part, e)
        return None
    return {"step": manifest.step, "wall_time": manifest.wall_time, "world_size": manifest.world_size,
            "files": [[rel, r.size, r.checksum] for rel, r in sorted(manifest.files.items())]}


def _chunks(files: list) -> list[int]:
    return [min(CHUNK_BYTES, size - offset) for _, size, _ in files for offset in range(0, size, CHUNK_BYTES)]


class _Pump:
    """The chunk exchange: each `step` sends this side's next chunk (if any) and receives one."""

    def __init__(self, link: Link, part: str | None, files: list, storage: Storage) -> None:
        self._link, self._left_out = link, len(_chunks(files))
        self._out = self._read(part, files, storage) if part is not None else iter(())

    @staticmethod
    def _read(part: str, files: list, storage: Storage) -> Iterator[torch.Tensor]:
        for rel, size, _ in files:  # a file shorter than announced is padded: its CRC-32 fails on arrival
            try:
                reader = storage.open_read(storage.join(part, rel))
            except OSError as e:
                logger.warning("cannot read %s to send it to its peer: %s", storage.join(part, rel), e)
                reader = None
            try:
                for offset in range(0, size, CHUNK_BYTES):
                    n = min(CHUNK_BYTES, size - offset)
                    data = reader.read(n) if reader is not None else b""
                    yield torch.frombuffer(bytearray(data.ljust(n, b"\0")), dtype=torch.uint8)
            finally:
                if reader is not None:
                    reader.close()

    def step(self, size: int | None) -> torch.Tensor | None:
        out = next(self._out, None) if self._left_out else None
        self._left_out -= out is not None
        into = torch.empty(size, dtype=torch.uint8) if size is not None else None
        self._link.swap(out, into)
        return into

    def drain_out(self) -> None:
        while self._left_out:
            self.step(None)


def exchange_part(link: Link, part: str | None, storage: Storage, *, root: str, name: str,
                  mark: Any = None) -> str | None:
    """Sends ``part`` (None: nothing) to ``link.send_to`` and receives ``link.recv_from``'s into
    ``root/name``, committed there (then ``mark(path)``); returns its path, or None when nothing
    came or it did not verify (a WARNING). Raises only on a transport error."""
    header = header_of(part, storage) if link.send_to is not None else None
    theirs = json.loads(link.swap_bytes(json.dumps(header).encode()) or b"null")
    pump = _Pump(link, part if header is not None else None, header["files"] if header else [], storage)
    if theirs is None:
        pump.drain_out()
        return None
    sizes = _chunks(theirs["files"])
    received = [0]
    temp = None
    try:
        storage.makedirs(root)
        temp = TempCheckpoint.create(root, name, storage)
        for rel, size, checksum in theirs["files"]:
            got = temp.write_file(rel, lambda w, s=size: _receive_file(pump, w, s, received))
            if got != FileRecord(size, checksum):
                raise CheckpointCorruptError(f"{rel} arrived with {got.size} bytes and checksum {got.checksum}, the "
                                             f"sender's manifest says {size} bytes with {checksum}")
        path = temp.finalize(step=theirs["step"], wall_time=theirs["wall_time"], world_size=theirs["world_size"]).path
    except Exception as e:  # noqa: BLE001 - this replica is lost, not the exchange: drain and go on
        if temp is not None:
            temp.discard()
        for size in sizes[received[0]:]:
            pump.step(size)
        pump.drain_out()
        logger.warning("the replica %s from rank %s was not kept: %s", f"{root}/{name}", link.recv_from, e)
        return None
    pump.drain_out()
    if mark is not None:
        mark(path)
    return path


def _receive_file(pump: _Pump, writer: Any, size: int, received: list[int]) -> None:
    for offset in range(0, size, CHUNK_BYTES):
        chunk = pump.step(min(CHUNK_BYTES, size - offset))
        received[0] += 1
        writer.write(chunk.numpy().data)
