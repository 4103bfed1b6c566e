"""The non-chief's session creator (SPEC §4): wait for the chief's checkpoint, restore it.

`WorkerSessionCreator` never writes and takes no lock. In a distributed job it restores exactly
what the chief chose (`supervisor.creators.chief_choice`); otherwise it polls the chief's
directory until its first verified checkpoint exists. The directory may be a local path or an
object-store URL (``s3://bucket/prefix``, SPEC §16): a URL is read through its `Storage`, made
once with the creator's ``storage_options`` (None: the client the environment configures), and
the chief's choice in a distributed job is read through it too.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Mapping

from supervisor.distributed import env
from supervisor._paths import check_path, check_storage, is_url, locate_logdir
from supervisor._validate import check_bool, check_choice, check_number
from supervisor.checkpoint.arguments import check_basename
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.layout.verify import VERIFY_MODES
from supervisor.checkpoint.load.apply import Restored, apply_checkpoint
from supervisor.checkpoint.load.choose import find_and_load
from supervisor.checkpoint.storage import Storage, split_scheme
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
        checkpoint_dir: the chief's checkpoint directory: a local path or an object-store URL
            (``s3://bucket/prefix``).
        max_wait_secs: how long to wait for a checkpoint before `TimeoutError`.
        recovery_wait_secs: the pause between two looks.
        basename, verify, trusted_globals, save_rng: as `CheckpointManager` (``save_rng``:
            restore this rank's RNG state when the checkpoint has one).
        clock: injectable clock.
        storage_options: the object-store client's options when ``checkpoint_dir`` is a URL
            (e.g. ``{"endpoint_url": ...}``); None: the standard configuration (``AWS_*``,
            ``~/.aws``, ``FSSPEC_S3_*``). Refused with a local path.
        init_fn, local_init_fn, ready_fn, logdir, summary_writer: as `SessionCreator`.
    """

    reinitialise_on_recreate = True

    def __init__(self, state: TrainingState | None, checkpoint_dir: str | os.PathLike, *,
                 max_wait_secs: float = 7200, recovery_wait_secs: float = 30,
                 basename: str = "model.ckpt", verify: str = "full", trusted_globals: Iterable[Any] = (),
                 save_rng: bool = True, clock: Clock | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 init_fn: Callable[[Any], Any] | None = None,
                 local_init_fn: Callable[[Any], Any] | None = None,
                 ready_fn: Callable[[Any], Any] | None = None,
                 logdir: str | None = None, summary_writer: Any = None) -> None:
        self.checkpoint_dir, self._storage = _watched_directory(checkpoint_dir, storage_options)
        super().__init__(state, init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
                         is_chief=False, logdir=logdir, summary_writer=summary_writer)
        self.max_wait_secs = check_number("max_wait_secs", max_wait_secs, minimum=0, allow_inf=True)
        self.recovery_wait_secs = check_number("recovery_wait_secs", recovery_wait_secs, strictly_positive=True)
        self.basename = check_basename(basename)
        self.verify = check_choice("verify", verify, VERIFY_MODES)
        self.unpickling = Unpickling(trusted_globals)  # every restore's allow-list, resolved once
        self.trusted_globals = self.unpickling.trusted_globals
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
                unpickling=self.unpickling, save_rng=self.save_rng, clock=self._clock,
                storage=self._storage)
        start = self._clock.monotonic()
        last_problem = "no checkpoint had been written"
        while True:
            try:
                loaded = find_and_load(self.checkpoint_dir, self.basename, verify=self.verify,
                                       unpickling=self.unpickling, storage=self._storage)
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


def _watched_directory(value: Any, storage_options: Mapping[str, Any] | None) -> tuple[str, Storage | None]:
    """``(directory, storage)`` of the chief's directory: a URL as given (no trailing ``/``) with
    its `Storage` (built here, connecting nowhere yet; the first look says what is wrong), a
    local path made absolute with None (the local storage, as before URLs were accepted).
    ``value`` may be the `Location` a front door resolved."""
    path = check_path("checkpoint_dir", value)
    if is_url(path):  # a front door's location comes with its storage: no second client
        location = locate_logdir("checkpoint_dir", value, writable=False, storage_options=storage_options)
        return location.path, location.storage  # type: ignore[union-attr]
    check_storage("checkpoint_dir", path, storage_options)  # options for a local path: refused
    return os.path.abspath(split_scheme(path)[1]), None
