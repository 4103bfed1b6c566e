"""How the ranks agree on the step to restore from their local tiers (SPEC §17, issue 33).

`agree_step`: each rank proposes its newest restorable step not newer than the current
candidate; the smallest proposal becomes the candidate, until every rank proposes it (the newest
step every rank holds) or some rank has none (-1). Each round is one all-reduce (MAX, negated for
the minimum) of a 4-integer record: ``O(1)`` bytes per rank whatever the world size, ``O(log W)``
latency. Two rounds when the ranks hold the same steps, one more per step some rank lacks. The
first round also carries the newest local step of any rank, the logdir's newest step (the
chief's) and the lowest rank whose local tier is empty (a replaced node), for the messages.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from supervisor import distributed

__all__ = ["agree_step", "all_reduce_max", "fallback_note", "lowest_lacking"]


def all_reduce_max(values: list[int]) -> list[int]:
    """The element-wise largest of every rank's ``values`` (one all-reduce; itself without a group)."""
    if not distributed.is_initialized():
        return list(values)
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(v) for v in tensor.tolist()]


def agree_step(propose: Callable[[int | None], int], *, newest: int, persistent: int, empty_rank: int) -> tuple[int, int, int, int, int]:
    """The newest step every rank can restore: ``propose(c)`` is this rank's newest restorable step
    not newer than ``c`` (-1: none). Returns (step or -1, the newest local step of any rank, the
    logdir's newest step (the chief's ``persistent``), the lowest rank with an empty local tier
    or -1, rounds). Each round is one all-reduce of a 4-integer record."""
    world = distributed.world_size() if distributed.is_initialized() else 1
    first = all_reduce_max([-propose(None), newest, persistent, world - empty_rank if empty_rank >= 0 else 0])
    candidate, rounds = -first[0], 1
    while candidate >= 0:
        agreed = -all_reduce_max([-propose(candidate), 0, 0, 0])[0]
        rounds += 1
        if agreed == candidate:
            break
        candidate = agreed
    return candidate, first[1], first[2], (world - first[3]) if first[3] else -1, rounds


def lowest_lacking(held: bool) -> int:
    """The lowest rank whose ``held`` is false (one all-reduce); -1 when every rank's is true."""
    world = distributed.world_size() if distributed.is_initialized() else 1
    rank = distributed.rank() if distributed.is_initialized() else 0
    value = all_reduce_max([0 if held else world - rank])[0]
    return world - value if value else -1


def fallback_note(step: int, newest: int, empty: int) -> str | None:
    """Why the logdir's ``step`` was restored, for a WARNING, when a local tier held a newer step
    (``newest``) or a rank's local tier was empty (``empty``, a replaced node); else None."""
    if newest < 0 or (newest <= step and empty < 0):
        return None
    lacking = (f"rank {empty}'s local tier has no checkpoint (a new or wiped node?)" if empty >= 0 else
               f"not every rank's local tier holds a restorable part of step {newest}")
    lost = f"the steps {step + 1}..{newest} are lost" if newest > step else "no step is lost"
    return f"{lacking}; {lost}, and the local parts newer than it are removed"
