"""Session creators backed by checkpoints (SPEC §4).

`CheckpointSessionCreator` (the chief) restores from the newest verified checkpoint at every
session creation, else runs ``init_fn``; it owns the `CheckpointManager` that writes. The
`WorkerSessionCreator` (non-chief processes) never writes and takes no lock: it waits until the
chief's first verified checkpoint exists and restores it.

Example::

    manager = CheckpointManager(logdir)
    creator = CheckpointSessionCreator(TrainingState.from_arguments(model=net, optimizer=opt), manager)
    with MonitoredSession(creator) as s:
        ...
        s.save_checkpoint(wait=True)
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from supervisor import distributed
from supervisor.distributed import restore as distributed_restore
from supervisor._paths import check_path
from supervisor._validate import check_bool, check_choice, check_number
from supervisor.checkpoint.finished import clear_finished, mark_finished
from supervisor.checkpoint.index import latest_checkpoint
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.options import check_basename, check_trusted_globals
from supervisor.checkpoint.restore import VERIFY_MODES, apply_checkpoint, find_and_load
from supervisor.clock import Clock, resolve_clock
from supervisor.checkpoint.restore import Restored
from supervisor.creator import SessionCreator
from supervisor.errors import CheckpointCorruptError, StopRequestedError
from supervisor.state import TrainingState

__all__ = ["CheckpointSessionCreator", "WorkerSessionCreator"]

logger = logging.getLogger(__name__)


class ManagedCheckpointCreator(SessionCreator):
    """What the creators that restore from a checkpoint manager share: the manager is closed
    with the session's environment, opened (ownership lock) at the first restore, and — when it
    has no ``on_error`` of its own — reports a failed background save to the session's
    ``request_stop``, so the session stops and its ``close`` re-raises it. On the chief it also
    keeps the run's finished mark (`supervisor.checkpoint.finished`), for ``state.pt`` and
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
        if self.is_chief:
            clear_finished(manager.directory)
        return manager

    def shutdown(self, *, failed: bool) -> None:
        super().shutdown(failed=failed)  # closing the manager commits the final checkpoint
        # -- finished mark (chief): a clean end that no signal caused (a preempted run resumes).
        session = getattr(self, "_session", None)
        if self.is_chief and not failed and session is not None and not session.preempted:
            mark_finished(self.checkpoints.directory, step=session.global_step,
                          checkpoint=latest_checkpoint(self.checkpoints.directory))


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
    """

    manager_type = (CheckpointManager, "supervisor.checkpoint.CheckpointManager")

    def __init__(self, state: TrainingState | None, manager: CheckpointManager, *,
                 init_fn: Callable[[Any], Any] | None = None,
                 local_init_fn: Callable[[Any], Any] | None = None,
                 ready_fn: Callable[[Any], Any] | None = None,
                 logdir: str | None = None, summary_writer: Any = None) -> None:
        super().__init__(state, manager, is_chief=True, init_fn=init_fn, local_init_fn=local_init_fn,
                         ready_fn=ready_fn, logdir=logdir, summary_writer=summary_writer)
        self._scratch_key: str | None = None  # a creation whose decision waits for init_fn

    def restore(self, session: Any) -> Restored | None:
        manager: CheckpointManager = self._open_manager(session)
        # Distributed (§12): the other ranks restore exactly what the chief chose here; when it
        # starts from scratch with an init_fn, they receive its state after init_fn (initialise).
        restored, self._scratch_key = distributed_restore.decide_as_chief(
            lambda: manager.restore(self.state), initialises=self.init_fn is not None)
        return restored

    def initialise(self, session: Any) -> None:
        key, self._scratch_key = self._scratch_key, None
        if key is None:
            super().initialise(session)
        else:
            distributed_restore.initialise_as_chief(key, lambda: self.init_fn(session), self.state)


class WorkerSessionCreator(SessionCreator):
    """A non-chief's creator: waits for the chief's verified checkpoint and restores it.

    Never writes and takes no lock. Polls every ``recovery_wait_secs`` (on the injectable clock)
    for at most ``max_wait_secs``.

    Args:
        state: the `TrainingState`.
        checkpoint_dir: the chief's checkpoint directory.
        max_wait_secs: how long to wait for a checkpoint before `TimeoutError`.
        recovery_wait_secs: the pause between two looks.
        basename, verify, trusted_globals, save_rng: as `CheckpointManager` (``save_rng``:
            restore this rank's RNG state when the checkpoint has one).
        clock: injectable clock.
        init_fn, local_init_fn, ready_fn, logdir, summary_writer: as `SessionCreator`.
    """

    reinitialise_on_recreate = True

    def __init__(self, state: TrainingState | None, checkpoint_dir: str | os.PathLike, *,
                 max_wait_secs: float = 7200, recovery_wait_secs: float = 30,
                 basename: str = "model.ckpt", verify: str = "full", trusted_globals: Iterable[Any] = (),
                 save_rng: bool = True, clock: Clock | None = None,
                 init_fn: Callable[[Any], Any] | None = None,
                 local_init_fn: Callable[[Any], Any] | None = None,
                 ready_fn: Callable[[Any], Any] | None = None,
                 logdir: str | None = None, summary_writer: Any = None) -> None:
        checkpoint_dir = check_path("checkpoint_dir", checkpoint_dir)
        super().__init__(state, init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
                         is_chief=False, logdir=logdir, summary_writer=summary_writer)
        self.checkpoint_dir = os.path.abspath(os.fspath(checkpoint_dir))
        self.max_wait_secs = check_number("max_wait_secs", max_wait_secs, minimum=0, allow_inf=True)
        self.recovery_wait_secs = check_number("recovery_wait_secs", recovery_wait_secs, strictly_positive=True)
        self.basename = check_basename(basename)
        self.verify = check_choice("verify", verify, VERIFY_MODES)
        self.trusted_globals = check_trusted_globals(trusted_globals)
        self.save_rng = check_bool("save_rng", save_rng)
        self._clock = resolve_clock(clock)

    def initialise(self, session: Any) -> None:
        """A non-chief rank never runs ``init_fn`` in a distributed job (SPEC §4): its restore
        already received the chief's state when the chief ran one."""
        if not distributed.is_distributed():
            super().initialise(session)
        elif self.init_fn is not None:
            logger.debug("rank %d does not run init_fn: it starts from the chief's state", distributed.rank())

    def restore(self, session: Any) -> Restored | None:
        if distributed.is_distributed():  # §12: wait for the chief's decision, restore exactly that
            return distributed_restore.follow_chief(
                self.state, max_wait_secs=self.max_wait_secs, verify=self.verify,
                trusted_globals=self.trusted_globals, save_rng=self.save_rng, clock=self._clock)
        start = self._clock.monotonic()
        last_problem = "no checkpoint had been written"
        while True:
            try:
                loaded = find_and_load(self.checkpoint_dir, self.basename, verify=self.verify,
                                       trusted_globals=self.trusted_globals)
            except CheckpointCorruptError as e:  # the chief may still write a good one
                loaded, last_problem = None, str(e)
            if loaded is not None:
                return apply_checkpoint(loaded, self.state, restore_rng=self.save_rng)
            waited = self._clock.monotonic() - start
            if waited >= self.max_wait_secs:
                raise TimeoutError(
                    f"waited {waited:.0f} s (max_wait_secs={self.max_wait_secs:g}) for the chief's "
                    f"first verified checkpoint in {self.checkpoint_dir}; {last_problem}. Check that "
                    "the chief is running and writes to this directory, or raise max_wait_secs")
            logger.info("waiting for the chief's checkpoint in %s (%.0f s so far)", self.checkpoint_dir, waited)
            # On the stop event, not a sleep: SIGTERM or request_stop() ends the wait at once.
            if self._clock.wait(session.coord.stop_event, min(self.recovery_wait_secs, self.max_wait_secs - waited)):
                why = session.stop_reason or ("a stop signal (SIGTERM/SIGINT)" if session.preempted
                                              else "stop requested")
                raise StopRequestedError(
                    f"stopped ({why}) after waiting {waited:.0f} s for the "
                    f"chief's first verified checkpoint in {self.checkpoint_dir}; nothing was restored")
