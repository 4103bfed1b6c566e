"""The non-chief's session creator (SPEC §4): wait for the chief's checkpoint, restore it.

`WorkerSessionCreator` never writes and takes no lock. In a distributed job it restores exactly
what the chief chose (`supervisor.creators.chief_choice`); otherwise it polls the chief's
directory until its first verified checkpoint exists.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from supervisor.distributed import env
from supervisor._paths import check_path
from supervisor._validate import check_bool, check_choice, check_number
from supervisor.checkpoint.options import check_basename, check_trusted_globals
from supervisor.checkpoint.restore import VERIFY_MODES, Restored, apply_checkpoint, find_and_load
from supervisor.clock import Clock, resolve_clock
from supervisor.creators import chief_choice
from supervisor.creators.base import SessionCreator
from supervisor.errors import CheckpointCorruptError, StopRequestedError
from supervisor.state import TrainingState

__all__ = ["WorkerSessionCreator"]

logger = logging.getLogger(__name__)


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
        if not env.is_distributed():
            super().initialise(session)
        elif self.init_fn is not None:
            logger.debug("rank %d does not run init_fn: it starts from the chief's state", env.rank())

    def restore(self, session: Any) -> Restored | None:
        if env.is_distributed():  # §12: wait for the chief's decision, restore exactly that
            return chief_choice.follow_chief(
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
