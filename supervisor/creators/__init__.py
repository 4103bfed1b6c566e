"""Session creators: the restore-or-initialise policy run at every session creation (SPEC §4).

- `SessionCreator` (base.py): the policy's order, the state kept in memory;
- `CheckpointSessionCreator` (chief.py): the chief restores from its `CheckpointManager`;
- `WorkerSessionCreator` (worker.py): a non-chief waits for the chief's checkpoint;
- `ShardedSessionCreator` (sharded.py): ``checkpoint_format="dcp"``, every rank;
- chief_choice.py: in a distributed job the chief's choice, followed by every rank;
- `wait_for_global_step` / `committed_step` (wait.py): any process waiting for the chief's committed
  progress (`hooks.GlobalStepWaiterHook` uses it).

They stand above `supervisor.checkpoint` (which never imports them) and below the front doors.
The names are also importable from `supervisor`, and, as before they moved here, from
`supervisor.checkpoint` / `supervisor.checkpoint.sharded` and `supervisor.creators`.
"""
from __future__ import annotations

from supervisor.creators.base import Restored, SessionCreator, check_session_fns, default_ready_fn
from supervisor.creators.chief import CheckpointSessionCreator, ManagedCheckpointCreator
from supervisor.creators.sharded import ShardedSessionCreator
from supervisor.creators.wait import committed_step, wait_for_global_step
from supervisor.creators.worker import WorkerSessionCreator

__all__ = ["CheckpointSessionCreator", "ManagedCheckpointCreator", "Restored", "SessionCreator",
           "ShardedSessionCreator", "WorkerSessionCreator", "check_session_fns", "committed_step", "default_ready_fn",
           "wait_for_global_step"]
