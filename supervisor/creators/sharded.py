"""The sharded session creator (SPEC §4, §12): ``checkpoint_format="dcp"``, on every rank.

The chief chooses the checkpoint (verified), every rank loads its shards of exactly that one:
`supervisor.checkpoint.sharded.manager.ShardedCheckpointManager.restore` does both.
"""
from __future__ import annotations

from typing import Any

from supervisor.checkpoint.sharded.manager import ShardedCheckpointManager
from supervisor.checkpoint.load.apply import Restored
from supervisor.creators.chief import ManagedCheckpointCreator
from supervisor.state import TrainingState

__all__ = ["ShardedSessionCreator"]


class ShardedSessionCreator(ManagedCheckpointCreator):
    """Restore-or-init from a `ShardedCheckpointManager`, on every rank (SPEC §4, §12).

    The chief chooses; every rank (chief or not) loads its shards of that checkpoint. Only the
    chief writes events; every rank takes part in each save. ``restore_step``: at the first
    creation, that step (or checkpoint path) instead of the newest, on every rank (the same
    value: `ShardedCheckpointManager.restore`). When the manager has no
    ``on_error``, a failed background save is routed to the session's ``request_stop``.
    """

    manager_type = (ShardedCheckpointManager, "ShardedCheckpointManager")

    def __init__(self, state: TrainingState | None, manager: ShardedCheckpointManager, *, is_chief: bool,
                 init_fn: Any = None, local_init_fn: Any = None, ready_fn: Any = None,
                 logdir: str | None = None, summary_writer: Any = None, restore_step: Any = None) -> None:
        super().__init__(state, manager, is_chief=is_chief, init_fn=init_fn, local_init_fn=local_init_fn,
                         ready_fn=ready_fn, logdir=logdir, summary_writer=summary_writer)
        self._restore_step = restore_step  # the first creation's choice (a step or a checkpoint path)

    def restore(self, session: Any) -> Restored | None:
        manager: ShardedCheckpointManager = self._open_manager(session)
        chosen, self._restore_step = self._restore_step, None  # a recovery restores the newest
        return manager.restore(self.state) if chosen is None else manager.restore(self.state, step=chosen)
