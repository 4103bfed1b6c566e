"""A sharded checkpoint restored in a job (SPEC §5.4, §12; issue 31): the chief chooses without
reading the shards, every rank verifies exactly the byte ranges it reads.

1. The chief chooses (`choose_sharded`): the index's choice, else older ones, as
   `supervisor.checkpoint.load.choose.choose_checkpoint` — but a checkpoint whose ``.metadata`` holds
   every item's CRC-32 (`supervisor.checkpoint.formats.dcp_ranges`, saved since issue 31) is checked by
   its manifest, the sizes of its files and its ``.metadata`` (checksummed) only, never read
   whole. An older checkpoint is verified whole, as before.
2. It posts its choice with the checkpoint's manifest (`supervisor.distributed.restore`) and
   sends the ``.metadata`` it read to every rank over the process group (DCP needs it whole on
   every rank); every rank loads exactly that checkpoint
   (`supervisor.checkpoint.sharded.state_dict.restore_sharded`): ``.metadata`` and its ``rng-<rank>.pt``
   checked against that manifest, each item it reads against its CRC-32.
3. The ranks agree on the outcome (one all-reduce of one number): when any rank found the
   checkpoint damaged, every rank skips it (WARNING naming the rank and why) and the chief
   chooses the next older one — a damaged checkpoint falls back as before, never a silent fresh
   start; any other failure fails every rank, naming the rank.

Storage bytes per restore: each rank its own ranges of the shards and its RNG file; the chief
additionally the manifest and ``.metadata`` (once), and the files' sizes. Total: the checkpoint
once (1.0×) when no state is replicated across ranks (DCP writes a replicated tensor once, and
every rank that needs it reads it).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from supervisor import distributed
from supervisor.checkpoint.load.choose import candidates, chosen_path
from supervisor.checkpoint.layout.format import list_committed, step_of
from supervisor.checkpoint.formats.dcp_ranges import verifiable_by_ranges
from supervisor.checkpoint.formats.dcp_reading import read_metadata
from supervisor.checkpoint.formats.dcp_replicated import read_replicated, replicated_infos, split_replicated
from supervisor.checkpoint.storage.fileio import crc32, format_checksum
from supervisor.checkpoint.layout.format import Manifest
from supervisor.checkpoint.load.loader import resolve_storage, verify_checkpoint
from supervisor.checkpoint.storage import Storage
from supervisor.checkpoint.layout.verify import DCP_METADATA
from supervisor.distributed import restore as restore_channel
from supervisor.distributed.restore import RestoreDecision
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError

__all__ = ["Choice", "checked_bytes", "checked_file", "choose_chosen", "choose_sharded", "restore_in_job"]

logger = logging.getLogger(__name__)

_OK, _DAMAGED, _FAILED = 0, 1, 2
#: a choice: path, step, manifest (None: an older chief's decision), ``.metadata``'s bytes (None: read them)
Choice = tuple[str, int, Manifest | None, bytes | None]


def choose_sharded(directory: str, basename: str, *, verify: str = "full", storage: Storage | None = None,
                   skip: Iterable[str] = ()) -> Choice | None:
    """``(path, step, manifest, .metadata's bytes)`` of the checkpoint a sharded restore takes
    (module docstring, 1.), passing over ``skip`` (found damaged by a rank); None when there is none.

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
            return _checked_choice(path, storage, verify)
        except (CheckpointNotFoundError, CheckpointCorruptError) as e:
            logger.warning("skipping checkpoint %s: %s", path, e)
            failures.append(f"{path}: {e}")
    if failures:
        raise CheckpointCorruptError(f"none of the checkpoints in {directory} can be restored ({'; '.join(failures)}). "
                                     "Refusing to start from scratch over them: repair or move them away")
    return None


def choose_chosen(directory: str, basename: str, chosen: Any, *, verify: str = "full", storage: Storage | None = None,
                  skip: Iterable[str] = (), elsewhere: str = "") -> Choice:
    """The `Choice` of the checkpoint ``chosen`` names (``restore_step=``: a step, or one of its
    paths), checked as `choose_sharded` checks; never another one in its place. ``elsewhere``:
    what other tiers hold, for the error.

    Raises:
        CheckpointNotFoundError: no committed checkpoint of that step (the steps there are named).
        CheckpointCorruptError: it fails verification, or a rank found it damaged (``skip``).
    """
    storage, directory = resolve_storage(directory, storage)
    path = chosen_path(directory, basename, chosen, storage)
    step = step_of(storage.basename(path), basename)
    steps = [s for s, _ in list_committed(directory, basename, storage)]
    there = (f"the logdir holds steps {', '.join(map(str, steps))}" if steps else "the logdir has no checkpoint yet") \
        + elsewhere
    if step not in steps:
        raise CheckpointNotFoundError(f"no checkpoint of step {step} to restore in {directory}: {there}; "
                                      "choose one of those steps")
    try:
        if path in skip:
            raise CheckpointCorruptError("a rank found it damaged (its log says why)")
        choice = _checked_choice(path, storage, verify)
    except (CheckpointNotFoundError, CheckpointCorruptError) as e:
        raise type(e)(f"the chosen checkpoint {path} cannot be restored: {e}; {there}") from e
    newer = [s for s in steps if s > step]
    if newer:
        logger.warning("restoring the chosen step %d of %s: the newer checkpoint(s) of step %s stay, and each is "
                       "replaced when this run saves that step again (as after `rollback`)", step, directory,
                       ", ".join(map(str, newer)))
    return choice


def _checked_choice(path: str, storage: Storage, verify: str) -> Choice:
    manifest = verify_checkpoint(path, verify="size", storage=storage)
    metadata = _metadata_bytes(path, manifest, storage, verify)
    if not verifiable_by_ranges(read_metadata(metadata, path)) and verify == "full":
        verify_checkpoint(path, verify="full", storage=storage)  # written before issue 31: whole
    return path, manifest.step, manifest, metadata


def _metadata_bytes(path: str, manifest: Manifest, storage: Storage, verify: str) -> bytes:
    if DCP_METADATA not in manifest.files:
        raise CheckpointCorruptError(f"{path} is not a sharded checkpoint (no {DCP_METADATA} in its manifest)")
    return checked_file(path, DCP_METADATA, manifest, storage, verify=verify)


def checked_file(path: str, name: str, manifest: Manifest | None, storage: Storage, *, verify: str = "full") -> bytes:
    """The bytes of the checkpoint's file ``name``, checked against ``manifest`` (size, and
    with ``verify="full"`` CRC-32; nothing to check without a manifest or a record).

    Raises:
        CheckpointCorruptError: unreadable, or not what the manifest says.
    """
    try:
        data = storage.read_bytes(storage.join(_base(path, manifest, storage), name))
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: {name} cannot be read ({e})") from e
    return checked_bytes(path, name, data, manifest, verify=verify)


def _base(path: str, manifest: Manifest | None, storage: Storage) -> str:
    """Where the checkpoint's files live: on an object store under the save's root (fencing.py)."""
    root = getattr(manifest, "root", None)
    return storage.join(path, root) if root and storage.basename(path) != root else path


def checked_bytes(path: str, name: str, data: bytes, manifest: Manifest | None, *, verify: str = "full") -> bytes:
    """``data``, the bytes of the checkpoint's file ``name``, checked as `checked_file` does."""
    record = manifest.files.get(name) if manifest is not None else None
    if record is None:
        return data
    if len(data) != record.size:
        raise CheckpointCorruptError(f"{path}: {name} has {len(data)} bytes, the manifest says {record.size}")
    if verify == "full" and format_checksum(crc32(data)) != record.checksum:
        raise CheckpointCorruptError(f"{path}: {name} checksum {format_checksum(crc32(data))} does not match "
                                     f"the manifest's {record.checksum} (the file is damaged)")
    return data


def restore_in_job(choose: Callable[[list[str]], Choice | None], load: Callable[..., Any], *,
                   max_wait_secs: float, clock: Any = None, storage: Storage | None = None) -> Any:
    """Chooses and loads as the module docstring says; returns ``load``'s result, or None when
    there is no checkpoint. ``choose(skip)`` runs on the chief (or alone); ``load(path, step,
    manifest, metadata, items)`` on every rank: the chief sends the ``.metadata`` bytes it checked
    to the others (`supervisor.distributed.restore.broadcast_bytes`), so they read none, and —
    reading them from ``storage`` — the replicated items (``items``: their bytes by file and
    offset, `supervisor.checkpoint.formats.dcp_replicated`; None when there are none).

    Raises:
        CheckpointCorruptError: every checkpoint is damaged.
        CheckpointError: the chief's choice failed, or a rank failed to load (named).
    """
    damaged: list[str] = []
    while True:
        decided = _decide(choose, damaged, storage, max_wait_secs=max_wait_secs, clock=clock)
        if decided is None:
            return None
        choice, items = decided
        path, step = choice[0], choice[1]
        status, outcome = _attempt(load, *choice, items)
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


#: A decision: the choice, and its replicated items (by file and offset; None: none; an
#: exception: they could not be read or differ).
Decided = tuple[Choice, Any]


def _decide(choose: Callable[[list[str]], Any], damaged: list[str], storage: Storage | None, *,
            max_wait_secs: float, clock: Any) -> Decided | None:
    """The chief's choice (posted for the others, then its ``.metadata`` and replicated items
    sent), or the choice the chief posted (with what it sends)."""
    if not distributed.is_distributed():
        choice = choose(damaged)
        return None if choice is None else (choice, None)
    if distributed.rank() == 0:
        key = restore_channel.next_key()
        try:
            choice = choose(damaged)
        except BaseException as e:  # read by every rank before the chief (and an env:// store) goes
            restore_channel.publish_failure(key, f"{type(e).__name__} on the chief (rank 0): {e}")
            raise
        if choice is None:
            restore_channel.publish_decision(key, RestoreDecision())
            return None
        size, blob, items = _replicated(choice, storage)
        restore_channel.publish_decision(key, RestoreDecision(choice[0], choice[1], manifest=choice[2].to_json(),
                                                              shared=size))
        _send(choice[3])
        if size:
            _send(blob)  # zeros when the chief could not read them: every rank then refuses them
        return choice, items
    return _followed(max_wait_secs, clock)


def _replicated(choice: Choice, storage: Storage | None) -> tuple[int, bytes, Any]:
    """The chief reads the replicated items of ``choice``: ``(their size, their bytes, the items
    by file and offset — or the error that stopped the read, or None when there are none)``."""
    path, _, manifest, metadata = choice
    if storage is None or manifest is None or metadata is None:
        return 0, b"", None
    infos: list[Any] = []
    try:
        infos = replicated_infos(read_metadata(metadata, path))
        blob = read_replicated(_base(path, manifest, storage), infos, storage, path)
        return len(blob), blob, (split_replicated(blob, infos, path) if infos else None)
    except CheckpointError as e:
        size = sum(info.length for info in infos)
        return size, bytes(size), e


def _followed(max_wait_secs: float, clock: Any) -> Decided | None:
    """A non-chief rank: the choice the chief posted, the ``.metadata`` and replicated items it sends."""
    decision = restore_channel.await_decision(restore_channel.next_key(), max_wait_secs=max_wait_secs, clock=clock)
    if decision.error is not None:
        raise CheckpointError(f"rank {distributed.rank()} cannot restore: the chief's restore failed with "
                              f"{decision.error}")
    if decision.path is None:
        return None
    if decision.manifest is None:  # an older chief: read .metadata from storage
        return (decision.path, int(decision.step or 0), None, None), None
    manifest = Manifest.from_json(decision.manifest)
    choice = (decision.path, int(decision.step or 0), manifest, _received(manifest.files[DCP_METADATA].size))
    if not decision.shared:
        return choice, None
    blob = _received(int(decision.shared))
    try:
        metadata = read_metadata(checked_bytes(choice[0], DCP_METADATA, choice[3], manifest), choice[0])
        return choice, split_replicated(blob, replicated_infos(metadata), f"{choice[0]} (as received from rank 0)")
    except CheckpointError as e:
        return choice, e


def _send(data: bytes) -> None:
    """The chief sends ``data`` to every rank (`_received`)."""
    source = memoryview(data)

    def fill(at: int, view: memoryview) -> None:
        view[:] = source[at:at + len(view)]

    restore_channel.broadcast_bytes(len(source), src=0, fill=fill)


def _received(size: int) -> bytes:
    """The ``size`` bytes the chief sends (`_send`)."""
    received = bytearray(size)

    def drain(at: int, view: memoryview) -> None:
        received[at:at + len(view)] = view

    restore_channel.broadcast_bytes(size, src=0, drain=drain)
    return bytes(received)


def _attempt(load: Callable[..., Any], *choice: Any) -> tuple[int, Any]:
    items = choice[-1]
    if isinstance(items, BaseException):  # the replicated items could not be read, or differ
        return (_DAMAGED if isinstance(items, CheckpointCorruptError) else _FAILED), items
    try:
        return _OK, load(*choice)
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
