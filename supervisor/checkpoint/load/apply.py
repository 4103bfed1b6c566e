"""Applying a verified checkpoint to a live training state (SPEC §4, §5.4): `apply_checkpoint`
loads the payload a `supervisor.checkpoint.load.loader` read into the state's entries and this
rank's RNG states, and returns what the session continues from (`Restored`)."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from supervisor import distributed
from supervisor.state import resume
from supervisor.checkpoint.layout.format import RNG_KEY, Manifest
from supervisor.checkpoint.load.loader import LoadedCheckpoint
from supervisor.checkpoint.load.private_copy import PrivateCopy
from supervisor.distributed import rng as distributed_rng
from supervisor.errors import CheckpointError
from supervisor.state import TrainingState, unwrap_module

__all__ = ["KeptCopy", "Restored", "apply_checkpoint"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptCopy:
    """What a restore with ``keep_copy`` read, open for a chief to share (then `close`): the
    verified private copy of ``state.pt`` and the manifest it verified against."""

    copy: PrivateCopy
    manifest: Manifest

    def close(self) -> None:
        self.copy.close()


@dataclass(frozen=True)
class Restored:
    """What a restore found: the global step and the checkpoint it came from; ``source``: its
    bytes, kept open when loaded with ``keep_copy`` (the chief shares and closes them)."""

    global_step: int
    path: str
    source: KeptCopy | None = field(default=None, compare=False, repr=False)


def apply_checkpoint(loaded: LoadedCheckpoint, state: TrainingState, *, restore_rng: bool = True,
                     strict: bool = True) -> Restored:
    """Loads a verified checkpoint into ``state`` (strict by default) and, with ``restore_rng``,
    this rank's RNG states; returns what the session needs to continue.

    Raises:
        CheckpointError: the checkpoint does not fit the state; names the path and step.
    """
    try:
        _apply(loaded, state, restore_rng=restore_rng, strict=strict)
    except BaseException:
        if loaded.source is not None:
            loaded.source.close()
        raise
    kept = KeptCopy(loaded.source, loaded.manifest) if loaded.source is not None else None
    return Restored(global_step=loaded.step, path=loaded.path, source=kept)


def _apply(loaded: LoadedCheckpoint, state: TrainingState, *, restore_rng: bool, strict: bool) -> None:
    payload = _materialize_non_modules(loaded.payload, state) if loaded.mapped else loaded.payload
    where = f"{loaded.path} (step {loaded.step})"
    live = resume.live_iterators(state)  # exact resume (supervisor/state/resume.py): checked before the load
    try:
        state.load_state_dict(payload, strict=strict)
    except CheckpointError as e:
        raise CheckpointError(f"restoring {loaded.path} (step {loaded.step}) failed: {e}") from e
    resume.prime_loaders(state, live, where)  # exact resume: may draw from the RNG, so before it
    if restore_rng:
        rank = distributed.rank()
        states = loaded.payload.get(RNG_KEY)
        if isinstance(states, dict) and rank in states:
            resume.restore_rng(states[rank], state, where=where)  # + the loaders' generators
        elif isinstance(states, dict) and states:  # the world size changed: a derived seed (§12)
            distributed_rng.restore_for_rank(states, rank, step=loaded.step, where=where)
        else:
            logger.warning("%s has no RNG state (saved with save_rng=False?); the random generators "
                           "continue from their current state", loaded.path)


def _materialize_non_modules(payload: dict, state: TrainingState) -> dict:
    """Copies the mapped tensors of entries that are not modules into memory.

    Modules copy what they load into their own parameters, so they read the mapped copy once
    and keep nothing. Other objects (an optimizer's moments, for one) keep the tensors they are
    given: left mapped, they would pin the private copy's memory for as long as they live.
    """
    out = dict(payload)
    for name, obj in state.items():
        if name in out and not isinstance(unwrap_module(obj), torch.nn.Module):
            out[name] = _copy_tensors(out[name])
    return out


def _copy_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        copied = type(value)((k, _copy_tensors(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            copied._metadata = value._metadata  # type: ignore[attr-defined]
        return copied
    if type(value) in (list, tuple):
        return type(value)(_copy_tensors(v) for v in value)
    return value
