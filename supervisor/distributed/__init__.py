"""torch.distributed support (SPEC §12): roles, chief-chosen restore, rank agreement.

Nothing here is a transport of its own: everything runs on ``torch.distributed`` process groups
(gloo on CPU, NCCL on GPUs) and the store torchrun (or ``init_process_group``) rendezvoused on.

- Detection and roles (env.py, which imports nothing of this project: every floor may use it):
  an initialised process group decides ``rank()``/``world_size()``, else torchrun's
  ``RANK``/``WORLD_SIZE``; the chief is rank 0 unless ``is_chief`` is given. Only the chief
  writes checkpoints and events.
- `init_process_group` / `destroy_process_group`: the torchrun-safe way to join and leave a
  group (a ``PrefixStore`` of the rendezvous round every rank agreed on, on the agent's store; a
  barrier before destroying).
- `CollectiveAgreement` (agreement.py): every rank saves and stops at the same step.
- failure.py, diagnosis.py, roll.py: the failed rank named exactly (`RankFailureError`), with
  O(1) store requests per rank, per step and per failure (docs/distributed.md).
- restore.py: the chief chooses the checkpoint, every rank restores exactly that one.
- rng.py: every rank's RNG state is gathered into the checkpoint.
- `wait_for_global_step` / `committed_step`: moved to `supervisor.creators` (they read the checkpoint
  index, a floor above this package); still importable from here: `supervisor`'s façade hands them on.
"""
from __future__ import annotations

from supervisor.distributed.env import (
    attempt,
    default_is_chief,
    default_store,
    destroy_process_group,
    init_process_group,
    is_distributed,
    is_initialized,
    rank,
    world_size,
)
from supervisor.distributed.agreement import CollectiveAgreement
from supervisor.distributed.failure import RankFailureError

__all__ = [
    "rank",
    "world_size",
    "default_is_chief",
    "is_initialized",
    "is_distributed",
    "attempt",
    "init_process_group",
    "destroy_process_group",
    "default_store",
    "CollectiveAgreement",
    "RankFailureError",
]
