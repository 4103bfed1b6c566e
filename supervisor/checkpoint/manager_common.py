"""What both checkpoint managers (state.pt and sharded) share about a save's start and failure.

A save nobody waits for fails on the writer thread: the failure goes to the manager's
``on_error`` (the session wires it to a stop request) and, if nothing took it, is raised by the
manager's next call on the training thread (SPEC §5.2). A save starts by checking its arguments,
raising such a failure and waiting for the save in flight. A mixin over the manager's
``directory``, ``_writer``, ``_mutex``, ``on_error``, ``_failure``, ``_failure_delivered`` and
``_pending`` (an overlapped capture's copy, settled before the next save waits for the writer,
which waits for that settle).
"""
from __future__ import annotations

import logging
from typing import Any

from supervisor._validate import check_int
from supervisor.errors import CheckpointError
from supervisor.state import TrainingState

logger = logging.getLogger(__name__)


class ManagerCommon:
    directory: str
    _writer: Any
    _mutex: Any
    on_error: Any
    _failure: CheckpointError | None
    _failure_delivered: bool
    _pending: Any = None  # the overlapped capture's background copy (overlap.PendingCopy)
    #: Whether every rank calls ``save`` at the same step and writes its own part (sharded).
    collective: bool = False

    def _settle(self) -> None:
        """Waits (on this, the training thread) for an overlapped capture's copy to be done with
        the live tensors, and removes its hooks; the writer then takes its verdict."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.settle()
            pending.release()

    def _deliver_failure(self, failure: CheckpointError) -> None:
        """Hands ``failure`` to ``on_error``; keeps the first one for `_raise_undelivered`."""
        delivered = False
        if self.on_error is not None:
            try:
                self.on_error(failure)
                delivered = True
            except BaseException as e:  # noqa: BLE001 - e.g. the session is past its last join
                logger.debug("on_error did not take the checkpoint failure (%s); raising it later", e)
        with self._mutex:
            if self._failure is None:
                self._failure, self._failure_delivered = failure, delivered

    def _begin_save(self, step: int, state: TrainingState, *, is_open: bool, kind: str) -> int:
        """Checks a save's arguments, raises an unreported failure, waits for the save in flight."""
        step = check_int("step", step, minimum=0)
        if not isinstance(state, TrainingState):
            raise TypeError(f"state must be a supervisor.TrainingState, got {type(state).__name__}")
        if not is_open:
            raise RuntimeError(f"the {kind} of {self.directory} is not open; call open() before save() "
                               "(and do not save after close())")
        self._raise_undelivered()
        self._settle()
        waited = self._writer.wait()
        if waited > 0:
            # Logged under the manager's own module, as each manager logs the rest of its saves.
            logging.getLogger(type(self).__module__).info(
                "the checkpoint of step %d waited %.3f s for the previous save to finish", step, waited)
            self._raise_undelivered()
        return step

    def _raise_undelivered(self) -> None:
        with self._mutex:
            if self._failure is None or self._failure_delivered:
                return
            failure, self._failure = self._failure, None
        raise failure
