"""Which checkpoints to keep (SPEC §5.5): pure functions of (checkpoints, times, history).

TensorFlow's ``CheckpointManager`` rules, step by step:

- retention manages the checkpoints it saved or found listed in the index (``checkpoints``,
  oldest first, each with its save time); anything else in the logdir is never touched;
- after a save, while more than ``max_to_keep`` are managed, the oldest leaves management: if it
  was saved at least ``keep_checkpoint_every_n_hours`` after the last preserved one, it is
  preserved for good (and becomes the new ``last_preserved_timestamp``), else it is deleted;
- ``max_to_keep=None`` keeps everything;
- the state survives restarts through the index (paths + timestamps + last preserved time).

No clock, no filesystem: the manager applies the decisions (deleting only after a newer commit),
and tests drive these functions with synthetic histories.

Example::

    state = recover(None, now=0.0)
    for step in range(1, 8):
        state = record(state, f"model.ckpt-{step}", timestamp=step * 3600.0)
        result = sweep(state, max_to_keep=5, keep_checkpoint_every_n_hours=2.0)
        state = result.state   # result.delete: names to delete now
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Collection

from supervisor.checkpoint.index import CheckpointState

__all__ = ["RetentionState", "SweepResult", "hold", "recover", "record", "sweep", "to_index"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionState:
    """Managed checkpoints ``(name, saved_timestamp)``, oldest first, and the time of the last
    checkpoint preserved by ``keep_checkpoint_every_n_hours``."""

    checkpoints: tuple[tuple[str, float], ...]
    last_preserved_timestamp: float

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.checkpoints)


@dataclass(frozen=True)
class SweepResult:
    """What a sweep decided: the new state, what to delete now, what is kept for good."""

    state: RetentionState
    delete: tuple[str, ...] = ()
    preserve: tuple[str, ...] = ()


def recover(index: CheckpointState | None, now: float, *,
            present: Collection[str] | None = None) -> RetentionState:
    """Rebuilds the state from the index at start-up (TF ``CheckpointManager.__init__``).

    Args:
        index: the index with paths relative to the logdir (or None when there is none).
        now: the current wall time; timestamps in the future are clamped to it, so a clock that
            went backwards cannot get old checkpoints deleted.
        present: the names that exist on disk; listed names not in it are dropped (they were
            deleted by a retention pass that crashed before rewriting the index).
    """
    if index is None:
        # A second before now: a manager re-created at once must not preserve its first save.
        return RetentionState((), now - 1.0)
    last_preserved = index.last_preserved_timestamp
    if last_preserved is None:
        last_preserved = now - 1.0
    if now < last_preserved:
        logger.warning("the checkpoint index's last_preserved_timestamp %.1f is in the future "
                       "(now %.1f); the system clock may have gone backwards", last_preserved, now)
        last_preserved = now
    paths = index.all_model_checkpoint_paths
    timestamps = index.all_model_checkpoint_timestamps
    if len(timestamps) != len(paths):
        timestamps = (last_preserved,) * len(paths)
    managed: dict[str, float] = {}
    for name, timestamp in zip(paths, timestamps, strict=True):
        timestamp = min(timestamp, now)
        if timestamp > last_preserved and (present is None or name in present):
            managed.pop(name, None)
            managed[name] = timestamp
    return RetentionState(tuple(managed.items()), last_preserved)


def record(state: RetentionState, name: str, timestamp: float) -> RetentionState:
    """Adds a newly committed checkpoint as the newest (re-saving a name moves it to the end)."""
    managed = [(n, t) for n, t in state.checkpoints if n != name]
    managed.append((name, float(timestamp)))
    return RetentionState(tuple(managed), state.last_preserved_timestamp)


def sweep(state: RetentionState, *, max_to_keep: int | None,
          keep_checkpoint_every_n_hours: float | None) -> SweepResult:
    """Decides which managed checkpoints leave management (TF ``CheckpointManager._sweep``)."""
    if not max_to_keep:
        return SweepResult(state)
    managed = list(state.checkpoints)
    last_preserved = state.last_preserved_timestamp
    delete: list[str] = []
    preserve: list[str] = []
    while len(managed) > max_to_keep:
        name, timestamp = managed.pop(0)
        if keep_checkpoint_every_n_hours and (
                timestamp - keep_checkpoint_every_n_hours * 3600.0 >= last_preserved):
            last_preserved = timestamp
            preserve.append(name)
        else:
            delete.append(name)
    return SweepResult(RetentionState(tuple(managed), last_preserved), tuple(delete), tuple(preserve))


def hold(result: SweepResult, before: RetentionState, held: Collection[str]) -> SweepResult:
    """``result`` without deleting the ``held`` names (a checkpoint tier's copy in flight): they
    stay managed, oldest first, and leave at a later sweep once no longer held."""
    kept = [n for n in result.delete if n in held]
    if not kept:
        return result
    again = tuple((n, t) for n, t in before.checkpoints if n in kept)
    return SweepResult(RetentionState(again + result.state.checkpoints, result.state.last_preserved_timestamp),
                       tuple(n for n in result.delete if n not in held), result.preserve)


def to_index(state: RetentionState, latest: str) -> CheckpointState:
    """The index that records ``state`` with ``latest`` as the checkpoint to restore."""
    return CheckpointState(
        model_checkpoint_path=latest,
        all_model_checkpoint_paths=state.names,
        all_model_checkpoint_timestamps=tuple(t for _, t in state.checkpoints),
        last_preserved_timestamp=state.last_preserved_timestamp,
    )
