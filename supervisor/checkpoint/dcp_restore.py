"""A sharded checkpoint restored in a job (SPEC §5.4, §12; issue 31): the chief chooses without
reading the shards, every rank verifies exactly the byte ranges it reads.

1. The chief chooses (`choose_sharded`): the index's choice, else older ones, as
   `supervisor.checkpoint.choose.choose_checkpoint` — but a checkpoint whose ``.metadata`` holds
   every item's CRC-32 (`supervisor.checkpoint.dcp_ranges`, saved since issue 31) is checked by
   its manifest, the sizes of its files and its ``.metadata`` (checksummed) only, never read
   whole. An older checkpoint is verified whole, as before.
2. It posts its choice with the checkpoint's manifest (`supervisor.distributed.restore`); every
   rank loads exactly it (`supervisor.checkpoint.dcp_io.restore_sharded`): ``.metadata`` and
   its ``rng-<rank>.pt`` checked against that manifest, each item it reads against its CRC-32.
3. The ranks agree on the outcome (one all-reduce of one number): when any rank found the
   checkpoint damaged, every rank skips it (WARNING naming the rank and why) and the chief
   chooses the next older one — a damaged checkpoint falls back as before, never a silent fresh
   start; any other failure fails every rank, naming the rank.

Storage bytes per restore: each rank its own ranges of the shards (plus ``.metadata``, the
manifest's text through the store, and its RNG file); the chief additionally the sizes and
``.metadata``. Total: the shards once (1.0×) when no state is replicated across ranks.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from supervisor import distributed
from supervisor.checkpoint.choose import candidates
from supervisor.checkpoint.dcp_ranges import verifiable_by_ranges
from supervisor.checkpoint.dcp_reading import read_metadata
from supervisor.checkpoint.fileio import crc32, format_checksum
from supervisor.checkpoint.format import Manifest
from supervisor.checkpoint.loader import resolve_storage, verify_checkpoint
from supervisor.checkpoint.storage import Storage
from supervisor.checkpoint.verify import DCP_METADATA
from supervisor.distributed import restore as restore_channel
from supervisor.distributed.restore import RestoreDecision
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError

__all__ = ["checked_file", "choose_sharded", "restore_in_job"]

logger = logging.getLogger(__name__)

_OK, _DAMAGED, _FAILED = 0, 1, 2


def choose_sharded(directory: str, basename: str, *, verify: str = "full", storage: Storage | None = None,
                   skip: Iterable[str] = ()) -> tuple[str, int, Manifest] | None:
    """``(path, step, manifest)`` of the checkpoint a sharded restore takes (module docstring,
    1.), passing over ``skip`` (found damaged by a rank); None when there is none.

    Raises:
        CheckpointCorruptError: checkpoints exist but none is usable (each listed with why).
    """
    storage, directory = resolve_storage(directory, storage)
    skipped = list(skip)
    failures = [f"{path}: a rank found it damaged" for path in skipped]
    for path in candidates(directory, basename, storage):
        if path in skipped:
            continue
        try:
            manifest = verify_checkpoint(path, verify="size", storage=storage)
            if not verifiable_by_ranges(_metadata(path, manifest, storage, verify)) and verify == "full":
                verify_checkpoint(path, verify="full", storage=storage)  # written before issue 31: whole
        except (CheckpointNotFoundError, CheckpointCorruptError) as e:
            logger.warning("skipping checkpoint %s: %s", path, e)
            failures.append(f"{path}: {e}")
            continue
        return path, manifest.step, manifest
    if failures:
        raise CheckpointCorruptError(f"none of the checkpoints in {directory} can be restored ({'; '.join(failures)}). "
                                     "Refusing to start from scratch over them: repair or move them away")
    return None


def _metadata(path: str, manifest: Manifest, storage: Storage, verify: str) -> Any:
    if DCP_METADATA not in manifest.files:
        raise CheckpointCorruptError(f"{path} is not a sharded checkpoint (no {DCP_METADATA} in its manifest)")
    return read_metadata(checked_file(path, DCP_METADATA, manifest, storage, verify=verify), path)


def checked_file(path: str, name: str, manifest: Manifest | None, storage: Storage, *, verify: str = "full") -> bytes:
    """The bytes of the checkpoint's file ``name``, checked against ``manifest`` (size, and
    with ``verify="full"`` CRC-32; nothing to check without a manifest or a record).

    Raises:
        CheckpointCorruptError: unreadable, or not what the manifest says.
    """
    try:
        data = storage.read_bytes(storage.join(path, name))
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: {name} cannot be read ({e})") from e
    record = manifest.files.get(name) if manifest is not None else None
    if record is None:
        return data
    if len(data) != record.size:
        raise CheckpointCorruptError(f"{path}: {name} has {len(data)} bytes, the manifest says {record.size}")
    if verify == "full" and format_checksum(crc32(data)) != record.checksum:
        raise CheckpointCorruptError(f"{path}: {name} checksum {format_checksum(crc32(data))} does not match "
                                     f"the manifest's {record.checksum} (the file is damaged)")
    return data


def restore_in_job(choose: Callable[[list[str]], tuple[str, int, Manifest] | None],
                   load: Callable[[str, int, Manifest | None], Any], *, max_wait_secs: float, clock: Any = None) -> Any:
    """Chooses and loads as the module docstring says; returns ``load``'s result, or None when
    there is no checkpoint. ``choose(skip)`` runs on the chief (or alone); ``load(path, step,
    manifest)`` on every rank.

    Raises:
        CheckpointCorruptError: every checkpoint is damaged.
        CheckpointError: the chief's choice failed, or a rank failed to load (named).
    """
    damaged: list[str] = []
    while True:
        choice = _decide(choose, damaged, max_wait_secs=max_wait_secs, clock=clock)
        if choice is None:
            return None
        path, step, manifest = choice
        status, outcome = _attempt(load, path, step, manifest)
        worst, rank = _agree(status)
        if worst == _OK:
            return outcome
        if worst == _FAILED:
            if status == _FAILED:
                raise outcome
            raise CheckpointError(f"restoring {path} (step {step}) failed on rank {rank} (its log says why)")
        why = outcome if status == _DAMAGED else f"rank {rank} found it damaged (its log says why)"
        logger.warning("skipping checkpoint %s: %s; trying the next older one", path, why)
        damaged.append(path)


def _decide(choose: Callable[[list[str]], Any], damaged: list[str], *, max_wait_secs: float,
            clock: Any) -> tuple[str, int, Manifest | None] | None:
    """The chief's choice (posted for the others), or the choice the chief posted."""
    if not distributed.is_distributed():
        return choose(damaged)
    if distributed.rank() == 0:
        key = restore_channel.next_key()
        try:
            choice = choose(damaged)
        except BaseException as e:
            restore_channel.publish_decision(key, RestoreDecision(error=f"{type(e).__name__}: {e}"))
            raise
        decision = RestoreDecision(choice[0], choice[1], manifest=choice[2].to_json()) if choice else RestoreDecision()
        restore_channel.publish_decision(key, decision)
        return choice
    decision = restore_channel.await_decision(restore_channel.next_key(), max_wait_secs=max_wait_secs, clock=clock)
    if decision.error is not None:
        raise CheckpointError(f"rank {distributed.rank()} cannot restore: the chief's restore failed with "
                              f"{decision.error}")
    if decision.path is None:
        return None
    manifest = Manifest.from_json(decision.manifest) if decision.manifest is not None else None
    return decision.path, int(decision.step or 0), manifest


def _attempt(load: Callable[..., Any], path: str, step: int, manifest: Manifest | None) -> tuple[int, Any]:
    try:
        return _OK, load(path, step, manifest)
    except CheckpointCorruptError as e:
        return _DAMAGED, e
    except Exception as e:  # noqa: BLE001 - every rank must learn of it before any raises
        return _FAILED, e


def _agree(status: int) -> tuple[int, int]:
    """``(worst status, lowest rank with it)`` over every rank (one all-reduce); alone: this one's."""
    if not distributed.is_distributed():
        return status, distributed.rank()
    size = distributed.world_size()
    value = restore_channel.all_reduce_max(status * (size + 1) + (size - distributed.rank()))
    return value // (size + 1), size - value % (size + 1)
