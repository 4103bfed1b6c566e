"""The chief's session creator, backed by a checkpoint manager (SPEC §4).

`CheckpointSessionCreator` (the chief) restores from the newest verified checkpoint at every
session creation, else runs ``init_fn``; it owns the `CheckpointManager` that writes. In a
distributed job it posts its choice for the other ranks (`supervisor.creators.chief_choice`).
`ManagedCheckpointCreator` is what it shares with the sharded creator
(`supervisor.creators.sharded`). The non-chief's creator is `supervisor.creators.worker`.

Example::

    manager = CheckpointManager(logdir)
    creator = CheckpointSessionCreator(TrainingState.from_arguments(model=net, optimizer=opt), manager)
    with MonitoredSession(creator) as s:
        ...
        s.save_checkpoint(wait=True)
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from supervisor.checkpoint.layout.finished import clear_finished, mark_finished
from supervisor.checkpoint.layout.index import latest_checkpoint
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.load.apply import Restored
from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
from supervisor.creators import chief_choice
from supervisor.distributed import env
from supervisor.creators.base import SessionCreator
from supervisor.state import TrainingState

__all__ = ["ManagedCheckpointCreator", "CheckpointSessionCreator"]

logger = logging.getLogger(__name__)


class ManagedCheckpointCreator(SessionCreator):
    """What the creators that restore from a checkpoint manager share: the manager is closed
    with the session's environment, opened (ownership lock) at the first restore, and — when it
    has no ``on_error`` of its own — reports a failed background save to the session's
    ``request_stop``, so the session stops and its ``close`` re-raises it. On the chief it also
    keeps the run's finished mark (`supervisor.checkpoint.layout.finished`), for ``state.pt`` and
    sharded runs alike, so an evaluator of either stops after the final checkpoint."""

    reinitialise_on_recreate = True
    #: the manager class a subclass takes, and its name in the error for any other argument
    manager_type: tuple[type, str] = (object, "checkpoint manager")

    def __init__(self, state: TrainingState | None, manager: Any, *, is_chief: bool,
                 init_fn: Callable[[Any], Any] | None, local_init_fn: Callable[[Any], Any] | None,
                 ready_fn: Callable[[Any], Any] | None, logdir: str | None, summary_writer: Any) -> None:
        kind, name = self.manager_type
        if not isinstance(manager, kind):
            raise TypeError(f"manager must be a {name}, got {manager!r}")
        super().__init__(state, init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
                         is_chief=is_chief, logdir=logdir if logdir is not None else manager.directory,
                         summary_writer=summary_writer)
        self.environment.checkpoints = manager  # closed with the environment
        self._routes_errors = manager.on_error is None

    def _open_manager(self, session: Any) -> Any:
        """Opens the manager at a session's restore; the chief also clears the run's finished
        mark there (issue 12, SPEC §10.2): a new session means the run is not finished."""
        manager = self.checkpoints
        manager.open()
        if self._routes_errors:
            manager.on_error = session.request_stop
        self._session = session
        if self.is_chief:  # checkpoint tiers: once their logdir is open, off the restore's path
            clear = lambda: clear_finished(manager.directory, storage=manager.storage)  # noqa: E731
            getattr(manager, "when_logdir_open", lambda action: action())(clear)
        return manager

    def shutdown(self, *, failed: bool) -> None:
        super().shutdown(failed=failed)  # closing the manager commits the final checkpoint
        # -- finished mark (chief): a clean end that no signal caused (a preempted run resumes).
        session = getattr(self, "_session", None)
        if self.is_chief and not failed and session is not None and not session.preempted:
            manager = self.checkpoints
            mark_finished(manager.directory, step=session.global_step, storage=manager.storage,
                          checkpoint=latest_checkpoint(manager.directory, storage=manager.storage))


class CheckpointSessionCreator(ManagedCheckpointCreator):
    """The chief's creator: restore-or-init from a `CheckpointManager`'s directory.

    The manager is opened (ownership lock) at the first creation and closed with the session.
    When the manager has no ``on_error``, a fatal background save failure is routed to the
    session's ``request_stop``, so the session stops and its ``close`` re-raises it.

    Args:
        state: the `TrainingState`.
        manager: the `CheckpointManager` that saves and restores.
        init_fn, local_init_fn, ready_fn, summary_writer: as `supervisor.SessionCreator`.
        logdir: the log directory (default: the manager's directory).
        restore_step: at the first creation, restore this step (or checkpoint path) instead of
            the newest (`CheckpointManager.restore`); later creations restore the newest.
    """

    manager_type = ((CheckpointManager, TieredCheckpointManager), "supervisor.checkpoint.CheckpointManager")

    def __init__(self, state: TrainingState | None, manager: CheckpointManager, *,
                 init_fn: Callable[[Any], Any] | None = None,
                 local_init_fn: Callable[[Any], Any] | None = None,
                 ready_fn: Callable[[Any], Any] | None = None,
                 logdir: str | None = None, summary_writer: Any = None, restore_step: Any = None) -> None:
        super().__init__(state, manager, is_chief=True, init_fn=init_fn, local_init_fn=local_init_fn,
                         ready_fn=ready_fn, logdir=logdir, summary_writer=summary_writer)
        self._scratch_key: str | None = None  # a creation whose decision waits for init_fn
        self._restore_step = restore_step  # the first creation's choice (a step or a checkpoint path)

    def restore(self, session: Any) -> Restored | None:
        manager: CheckpointManager = self._open_manager(session)
        # Distributed (§12): the other ranks restore exactly what the chief chose here; when it
        # starts from scratch with an init_fn, they receive its state after init_fn (initialise).
        chosen, self._restore_step = self._restore_step, None  # a recovery restores the newest
        restored, self._scratch_key = chief_choice.decide_as_chief(
            lambda: manager.restore(self.state, step=chosen, keep_copy=env.is_distributed()),  # shared: read once
            initialises=self.init_fn is not None)
        if hasattr(manager, "open_logdir"):  # checkpoint tiers: the logdir opens after the first step
            _open_after_first_step(session, manager, restored.global_step if restored is not None else 0)
        return restored

    def initialise(self, session: Any) -> None:
        key, self._scratch_key = self._scratch_key, None
        if key is None:
            super().initialise(session)
        else:
            chief_choice.initialise_as_chief(key, lambda: self.init_fn(session), self.state)


def _open_after_first_step(session: Any, manager: Any, step: int) -> None:
    """Calls ``manager.open_logdir()`` at the boundary after the session's first step past ``step``
    (not at the creation's boundary): a tiered resume from the local tier opens the logdir (the
    object store's client, lease, index) only then, off the restore's and the first step's path."""
    def action(s: Any) -> None:
        if s.global_step > step:
            manager.open_logdir()
        else:
            s.call_at_boundary(action)
    session.call_at_boundary(action)
