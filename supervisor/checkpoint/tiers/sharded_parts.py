"""One rank's part of a sharded checkpoint in the node-local tier (SPEC §17, issue 33).

With ``checkpoint_format="dcp"`` and a ``local_dir`` every rank keeps its own shards in its
node's local tier, under a directory of its own (ranks of one node share ``local_dir``)::

    <local_dir>/rank-1/
      model.ckpt-40/          # rank 1's part of step 40, committed with the local protocol:
        .metadata             #   DCP's metadata of this rank's items only (a one-rank DCP save)
        __1_0.distcp          #   its shards (DTensor local shards, its copy of replicated state)
        rng-1.pt              #   its RNG and data-loader generator states
        MANIFEST.json         #   size and CRC-32 of each, written last, then the rename
      model.ckpt-40.all-ranks # the chief's commit: every rank's part of step 40 was durable

A part is a complete one-process DCP checkpoint of the rank's *local* view (`save_part`: no
collective, nothing read back), so a rank restores from its own node alone (`load_part`); the
world size and the rank must be the ones that saved it (else the job restores from the logdir,
which reshards). Only a part with its ``.all-ranks`` mark is restorable (`committed_steps`): the
mark is written after the chief said every rank's part is durable.

The persistent copy merges the parts into one ordinary DCP checkpoint in the logdir: each rank
streams its data files (named ``__<rank>_*``, so they never collide) and its ``.metadata`` (as
``rank-<r>.metadata``) into the staged checkpoint, verified against its local manifest
(`copy_part`); the chief writes the union of the ranks' metadata as ``.metadata``
(`merged_metadata`) before sealing, so the logdir's checkpoint restores like any other (on
another world size too) and is read by the evaluator and the CLI.
"""
from __future__ import annotations

import collections
import logging
import os
import pickle
import threading
import time
import warnings
from typing import Any, Callable, Iterable

from supervisor.checkpoint.formats.dcp_reading import read_metadata
from supervisor.checkpoint.layout.format import FileRecord, checkpoint_name, read_manifest, step_of
from supervisor.checkpoint.layout.verify import DCP_METADATA
from supervisor.checkpoint.load.loader import verify_checkpoint
from supervisor.checkpoint.save.temp import TempCheckpoint
from supervisor.checkpoint.storage import LocalStorage, Storage
from supervisor.errors import CheckpointCorruptError, CheckpointError

__all__ = ["ALL_RANKS", "COPY_CHUNK_BYTES", "CopyQueue", "committed_steps", "copy_part", "mark_committed",
           "merged_metadata", "part_root", "prune_parts", "remove_part", "save_part", "unmark", "verified_part"]

logger = logging.getLogger(__name__)

#: The node-local tier's disk (the storage rule: every filesystem call goes through a Storage).
_NODE_DISK = LocalStorage()

#: How much of a file is in memory at once while it is copied to the logdir.
COPY_CHUNK_BYTES = 8 << 20
#: The suffix of the chief's commit mark next to a rank's part.
ALL_RANKS = ".all-ranks"


def part_root(local_dir: str, rank: int) -> str:
    """The directory of ``rank``'s parts in the node-local tier."""
    return os.path.join(local_dir, f"rank-{rank}")


def save_part(root: str, storage: Storage, *, name: str, step: int, wall_time: float, state_dict: Any, rng: Any,
              rank: int, world_size: int) -> str:
    """Writes and commits this rank's part of ``step`` under ``root`` (staged, each file's CRC-32
    computed while written, fsynced, manifest last, renamed); returns its path. Raises on failure
    (the staged directory is removed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StoragePrefix

    from supervisor.checkpoint.formats.dcp_ranges import ItemChecksums  # lazy: imports DCP
    from supervisor.checkpoint.formats.serialize import serialize

    class Writer(ItemChecksums, FileSystemWriter):
        def prepare_global_plan(self, plans: list) -> list:  # files named for the rank: a merge never collides
            import dataclasses

            return [dataclasses.replace(p, storage_data=_StoragePrefix(f"__{rank}_")) for p in plans]

    storage.makedirs(root)
    temp = TempCheckpoint.create(root, name, storage)
    try:
        writer = Writer(temp.path, sync_files=True)
        writer.record_items()
        with warnings.catch_warnings():  # a one-rank save on purpose, not DCP's guess
            warnings.filterwarnings("ignore", message=".*assuming the intent is to save in a single process")
            dcp.save(state_dict, storage_writer=writer, no_dist=True)
        for rel, record in writer.file_records(f"__{rank}_").items():
            temp.add_record(rel, record)
        if rng is not None:
            temp.write_file(f"rng-{rank}.pt", lambda w: serialize(rng, w))
        return temp.finalize(step=step, wall_time=wall_time, world_size=world_size).path
    except BaseException:
        temp.discard()
        raise


def mark_committed(path: str) -> None:
    """The chief's commit, recorded next to this rank's part (written atomically and fsynced,
    with its directory, through the node-local disk's `LocalStorage`)."""
    _NODE_DISK.write_atomic(path + ALL_RANKS, b"")


def committed_steps(root: str, basename: str) -> list[int]:
    """Steps of this rank's parts that carry the chief's commit, newest first."""
    try:
        names = set(_NODE_DISK.listdir(root))
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        step = step_of(name, basename)
        if step is not None and name + ALL_RANKS in names:
            steps.append(step)
    return sorted(steps, reverse=True)


def verified_part(root: str, basename: str, step: int, storage: Storage, *, world_size: int,
                  verify: str) -> str | None:
    """The path of this rank's part of ``step`` when it verifies and was saved at ``world_size``;
    else None, with a WARNING naming why."""
    path = os.path.join(root, checkpoint_name(basename, step))
    try:
        manifest = verify_checkpoint(path, verify=verify, storage=storage)
    except (CheckpointError, OSError) as e:
        logger.warning("the local tier's part %s (step %d) cannot be restored: %s; trying an older step", path,
                       step, e)
        return None
    if manifest.world_size != world_size:
        logger.info("the local tier's part %s was saved by %d ranks, this job has %d: not restorable here (the "
                    "logdir's copy reshards)", path, manifest.world_size, world_size)
        return None
    return path


def prune_parts(root: str, basename: str, *, keep: int | None, held: Iterable[int] = (),
                newer_than: int | None = None) -> None:
    """This rank's retention: keeps the ``keep`` newest committed parts and those ``held`` (a copy
    to the logdir pending), drops parts without the chief's mark older than the newest committed
    one, and every part newer than ``newer_than`` (an abandoned timeline, after a restore). The
    mark goes first, so a part is never restorable half deleted."""
    try:
        names = _NODE_DISK.listdir(root)
    except FileNotFoundError:
        return
    committed, held = committed_steps(root, basename), set(held)
    kept = set(committed[:keep] if keep is not None else committed) | held
    newest = committed[0] if committed else None
    for name in names:
        step = step_of(name, basename)
        if step is None or step in held:
            continue
        stale = newer_than is not None and step > newer_than
        unmarked = step not in committed and newest is not None and step < newest
        if stale or unmarked or (step in committed and step not in kept):
            remove_part(os.path.join(root, name))
    for name in names:  # a crashed writer's staging leftovers
        if ".tmp-" in name:
            remove_part(os.path.join(root, name))


def unmark(path: str) -> None:
    """Takes the chief's mark off one part: kept, never restored (``restore_step=`` an older step)."""
    _NODE_DISK.remove(path + ALL_RANKS)


def remove_part(path: str) -> None:
    """Removes one part: its mark first (never restorable half deleted), then its directory."""
    _NODE_DISK.remove(path + ALL_RANKS)
    _NODE_DISK.remove_tree(path)


def copy_part(part: str, local: Storage, staged: str, storage: Storage, rank: int) -> dict[str, list]:
    """Streams this rank's part into the staged logdir checkpoint ``staged`` (its ``.metadata`` as
    ``rank-<rank>.metadata``), each file's checksum computed while sent and compared with the
    part's manifest; returns the records ``{name: [size, crc]}``. Raises `CheckpointCorruptError`
    when the local part does not match its manifest."""
    manifest = read_manifest(part, local)
    own = TempCheckpoint(storage.dirname(staged), storage.basename(staged), staged, storage)
    for rel, record in manifest.files.items():
        target = f"rank-{rank}.metadata" if rel == DCP_METADATA else rel
        sent = own.write_file(target, lambda w, r=rel: _stream(local, local.join(part, r), w))
        if sent != record:
            raise CheckpointCorruptError(f"{local.join(part, rel)}: {sent.size} bytes with checksum {sent.checksum} "
                                         f"were read, its manifest says {record.size} bytes with {record.checksum} "
                                         "(the local part is damaged); not persisting it")
    return {rel: [r.size, r.checksum] for rel, r in own.records.items()}


def _stream(storage: Storage, path: str, writer: Any) -> None:
    with storage.open_read(path) as f:
        while chunk := f.read(COPY_CHUNK_BYTES):
            writer.write(chunk)


def merged_metadata(staged: str, storage: Storage, world_size: int) -> bytes:
    """One DCP ``.metadata`` for the staged checkpoint: the union of every rank's items (a
    sharded tensor's chunks from each rank, a replicated item once, from the lowest rank)."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    merged: dict[str, Any] = {}
    storage_data: dict[Any, Any] = {}
    planner_data: dict[Any, Any] = {}
    version = None
    for rank in range(world_size):
        where = storage.join(staged, f"rank-{rank}.metadata")
        metadata = read_metadata(storage.read_bytes(where), where)
        version = version or metadata.version
        planner_data.update(metadata.planner_data or {})
        for fqn, item in metadata.state_dict_metadata.items():
            have = merged.get(fqn)
            if have is None:
                merged[fqn] = (TensorStorageMetadata(item.properties, item.size, list(item.chunks))
                               if isinstance(item, TensorStorageMetadata) else item)
            elif isinstance(item, TensorStorageMetadata):
                offsets = {tuple(c.offsets) for c in have.chunks}
                have.chunks.extend(c for c in item.chunks if tuple(c.offsets) not in offsets)
        for index, info in (metadata.storage_data or {}).items():
            storage_data.setdefault(index, info)
    out = Metadata(state_dict_metadata=merged, planner_data=planner_data, storage_data=storage_data,
                   version=version)
    return pickle.dumps(out)


def record_of(data: bytes) -> FileRecord:
    """The manifest record of ``data``."""
    from supervisor.checkpoint.storage.fileio import crc32, format_checksum

    return FileRecord(len(data), format_checksum(crc32(data)))


class CopyQueue:
    """One rank's persist thread: ``copy(step, key, path)`` of each queued part, in order (the
    ranks queue the same steps in the same order: the chief decides, in its commit)."""

    def __init__(self, copy: Callable[[int, str, str], Any]) -> None:
        self._copy = copy
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[int, str, str]] = collections.deque()
        self._busy: int | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="supervisor-dcp-persist", daemon=True)
        self._thread.start()

    def enqueue(self, step: int, key: str, path: str) -> None:
        with self._cond:
            self._queue.append((step, key, path))
            self._cond.notify_all()

    def held(self) -> set[int]:
        with self._cond:
            return {s for s, _, _ in self._queue} | ({self._busy} if self._busy is not None else set())

    def idle(self) -> bool:
        with self._cond:
            return not self._queue and self._busy is None

    def flush(self, timeout_secs: float | None) -> bool:
        deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
        with self._cond:
            while self._queue or self._busy is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self, join_secs: float = 10.0) -> list[int]:
        """Stops taking copies and joins the thread (a copy still in flight after ``join_secs``
        is left behind: a daemon thread); returns the steps left unpersisted."""
        with self._cond:
            left = sorted(self.held())
            self._closing = True
            self._queue.clear()
            self._cond.notify_all()
        self._thread.join(join_secs)
        return left

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                step, key, path = self._queue.popleft()
                self._busy = step
            try:
                self._copy(step, key, path)
            except Exception:  # noqa: BLE001 - a copy failure is logged; the next due step is persisted
                logger.exception("persisting the sharded checkpoint of step %d failed", step)
            finally:
                with self._cond:
                    self._busy = None
                    self._cond.notify_all()
