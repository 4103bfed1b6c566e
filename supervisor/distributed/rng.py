"""Per-rank RNG states in checkpoints (SPEC §2, §12).

A checkpoint keeps one RNG state per rank (``payload["rng"] = {rank: state}``). At an agreed
save every rank takes part in one ``gather_object`` to the chief (`gather`, called by the
`CollectiveAgreement` at the boundary, where every rank is at the same step); the states ride in
the agreement's `Decision` to the chief's capture, which stores all of them
(`states_for_checkpoint`). Saves that are not agreed (the save at
session creation, ``save_checkpoint()`` between steps on the chief) hold the chief's state only.

On restore each rank takes its own state back (`restore_for_rank`). When the world size changed:

- a rank whose number is in the checkpoint gets that rank's saved state back;
- a rank with no saved state is seeded with a **derived seed**: ``int.from_bytes(sha256(b"%d:%d"
  % (step, rank)).digest()[:8], "little") % 2**63`` for torch and Python, the same modulo 2**32
  for NumPy (``step`` is the checkpoint's global step). Distinct per rank, and the same on every
  restart from the same checkpoint, so a resized job is still reproducible.
"""
from __future__ import annotations

import hashlib
import logging
import random
from typing import Any, Mapping

import numpy as np
import torch

from supervisor.distributed import env
from supervisor.state.rng import capture_rng_state, restore_rng_state

__all__ = ["derived_seed", "gather", "restore_for_rank", "states_for_checkpoint"]

logger = logging.getLogger(__name__)

def gather(group: Any = None, capture: Any = None) -> dict[int, Any] | None:
    """Every rank's RNG state to the chief (rank 0): ``{rank: state}`` there, None on the
    other ranks. A collective: every rank of ``group`` must call it at the same boundary (the
    agreement does, and hands the states to the capture in its `Decision`). ``capture()``
    returns this rank's state (default: `supervisor.state.rng.capture_rng_state`)."""
    import torch.distributed as dist  # optional at import: torch.distributed may be unavailable

    own = capture() if capture is not None else capture_rng_state()
    size = dist.get_world_size(group)
    out: list[Any] | None = [None] * size if dist.get_rank() == 0 else None
    dist.gather_object(own, out, dst=0, group=group)
    if out is None:
        return None
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
    return {int(r): s for r, s in zip(ranks, out)}


def states_for_checkpoint(own: Any, gathered: Mapping[int, Any] | None = None) -> dict[int, Any]:
    """The RNG states a checkpoint stores: every rank's when the agreement ``gathered`` them at
    this boundary, else only ``own`` (this process's, just captured) under its rank."""
    if gathered is not None:
        states = dict(gathered)
        states[env.rank()] = own  # the same state, captured at the capture itself
        return states
    return {env.rank(): own}


def derived_seed(step: int, rank: int) -> int:
    """The seed of a rank the checkpoint has no RNG state for (see the module docstring)."""
    digest = hashlib.sha256(b"%d:%d" % (int(step), int(rank))).digest()
    return int.from_bytes(digest[:8], "little") % 2**63


def restore_for_rank(states: Mapping[int, Any], rank: int, *, step: int, where: str) -> None:
    """Restores ``rank``'s saved state, or seeds it with `derived_seed` when it has none."""
    if rank in states:
        restore_rng_state(states[rank], where=where)
        return
    seed = derived_seed(step, rank)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    logger.warning("%s has RNG states for ranks %s but not for rank %d (the world size changed?); "
                   "seeded rank %d's generators with the derived seed %d", where, sorted(states), rank,
                   rank, seed)
