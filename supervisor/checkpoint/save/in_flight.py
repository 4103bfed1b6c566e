"""What both checkpoint managers (state.pt and sharded) share about a save's start and failure.

A save nobody waits for fails on the writer thread: the failure goes to the manager's
``on_error`` (the session wires it to a stop request) and, if nothing took it, is raised by the
manager's next call on the training thread (SPEC §5.2). A save starts by checking its arguments,
raising such a failure and waiting for the save in flight.

When it is cleared: a fatal failure nothing took stays until the next save starts. Until then
every ``wait()`` raises it — each of several threads waiting at once, and every later call, as a
failed `concurrent.futures.Future` does for each ``result()`` — and so does ``close()`` if no
``wait()`` did. The next ``save()`` clears it: it raises it instead of saving when nobody has
seen it yet, and otherwise (a ``wait()`` raised it) simply starts. A failure ``on_error`` took
is the session's to report: ``wait()`` does not raise it. A mixin over the manager's
``directory``, ``_writer``, ``_mutex``, ``on_error``, ``_failure``, ``_failure_delivered`` and
``_pending`` (an overlapped capture's copy, settled before the next save waits for the writer,
which waits for that settle).
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from supervisor._validate import check_int
from supervisor.errors import CheckpointError
from supervisor.state import TrainingState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingSave:
    """A save as `start_save` returns it: the checkpoint of ``step`` goes to ``path``, and
    ``committed`` resolves to ``path`` once it is committed (cancelled when the save failed
    or was discarded: the manager's ``on_error`` and next call report why)."""

    step: int
    path: str
    committed: Future


class ManagerCommon:
    directory: str
    _writer: Any
    _mutex: Any
    on_error: Any
    _failure: CheckpointError | None
    _failure_delivered: bool
    _failure_raised: bool = False  # a wait() raised it: the next save starts instead of raising it
    _pending: Any = None  # the overlapped capture's background copy (overlap.PendingCopy)
    #: Whether every rank calls ``save`` at the same step and writes its own part (sharded).
    collective: bool = False
    #: ``on_commit(step, path)``, called on the writer thread once a checkpoint is committed.
    on_commit: Callable[[int, str], Any] | None = None
    _in_flight: dict[int, Future] | None = None  # start_save's futures by step
    _durable: Callable[[], Any] | None = None  # start_save's ``durable``, taken by the save it starts
    _save_started: tuple[int, float] | None = None  # (step, time.monotonic()) of the last save's start
    _warned_wait: bool = False  # whether saves that wait for the previous one were warned about
    _waits_in_a_row: int = 0  # saves in a row that waited for the previous one

    def start_save(self, step: int, state: TrainingState, *, wait: bool = False,
                   rng_states: Mapping[int, Any] | None = None,
                   durable: Callable[[], Any] | None = None) -> PendingSave:
        """`save`, returning the save as a value: its step, its path, and a future that resolves
        when it commits (callbacks added to it run on the writer thread). ``durable()``: called
        right before the commit (on the writer thread), what must be durable before the
        checkpoint is published — a session's summaries of the steps it holds."""
        future: Future = Future()
        with self._mutex:
            if self._in_flight is None:
                self._in_flight = {}
            self._in_flight[int(step)] = future
        kwargs = {"rng_states": rng_states} if rng_states is not None else {}
        self._durable = durable
        try:
            path = self.save(step, state, wait=wait, **kwargs)  # type: ignore[attr-defined]
        except BaseException:
            with self._mutex:
                if self._in_flight.get(int(step)) is future:
                    del self._in_flight[int(step)]
            future.cancel()
            raise
        finally:
            self._durable = None
        return PendingSave(int(step), path, future)

    def _take_durable(self) -> Callable[[], Any] | None:
        """The ``durable`` of the save `start_save` is starting (None for a plain ``save``)."""
        durable, self._durable = self._durable, None
        return durable

    def _report_commit(self, step: int, path: str) -> None:
        """The commit of ``step``: resolves its `start_save` future, then calls ``on_commit``.
        Commits come in save order (one writer): an earlier save still unresolved never commits
        (it failed or was discarded), so its future is cancelled."""
        with self._mutex:
            done = [s for s in self._in_flight or () if s <= step]
            futures = {s: self._in_flight.pop(s) for s in done}
        for s, future in futures.items():
            if s == step:
                future.set_result(path)
            else:
                future.cancel()
        on_commit = self.on_commit
        if on_commit is not None:
            try:
                on_commit(step, path)
            except Exception:  # noqa: BLE001 - the checkpoint is committed; a listener's queue failed
                logger.exception("reporting the commit of %s failed", path)

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
                self._failure, self._failure_delivered, self._failure_raised = failure, delivered, False

    def _begin_save(self, step: int, state: TrainingState, *, is_open: bool, kind: str) -> int:
        """Checks a save's arguments, raises an unreported failure, waits for the save in flight."""
        step = check_int("step", step, minimum=0)
        if not isinstance(state, TrainingState):
            raise TypeError(f"state must be a supervisor.TrainingState, got {type(state).__name__}")
        if not is_open:
            raise RuntimeError(f"the {kind} of {self.directory} is not open; call open() before save() "
                               "(and do not save after close())")
        self._clear_failure()
        self._settle()
        requested = time.monotonic()
        waited = self._writer.wait()
        self._waits_in_a_row = self._waits_in_a_row + 1 if waited > 0 else 0
        if waited > 0:
            self._report_wait(step, waited, requested)
            self._clear_failure()
        self._save_started = (step, time.monotonic())
        return step

    def _report_wait(self, step: int, waited: float, requested: float) -> None:
        """A save that waited for the previous one. Two in a row mean saves fall due faster than
        the storage writes them, and training pauses at each: a WARNING the first time, with the
        figures (as Orbax warns); INFO otherwise (a one-off, such as the final save right after a
        scheduled one). Logged under the manager's own module, as it logs the rest of its saves."""
        log = logging.getLogger(type(self).__module__)
        previous, started = self._save_started or (None, requested)
        if self._warned_wait or self._waits_in_a_row < 2:
            log.info("the checkpoint of step %d waited %.3f s for the previous save to finish", step, waited)
            return
        self._warned_wait = True
        log.warning("the checkpoint of step %d waited %.2f s for the save of step %s to finish, the second save in a "
                    "row to wait: the saves came "
                    "%.2f s apart, but that save took %.2f s to capture and write, so training pauses at each "
                    "save. Save less often (save_checkpoint_secs/save_checkpoint_steps, save_model_secs, "
                    "save_checkpoints_secs/steps) or to faster storage (said once; later waits are logged at INFO)",
                    step, waited, previous, requested - started, requested + waited - started)

    def _raise_undelivered(self) -> None:
        """``wait()``'s end: raises the fatal failure nothing took, to every caller, every time,
        until the next save clears it (see the module docstring); the same exception object."""
        with self._mutex:
            if self._failure is None or self._failure_delivered:
                return
            failure, self._failure_raised = self._failure, True
        raise failure

    def _clear_failure(self) -> None:
        """A save's start: clears the fatal failure nothing took; raises it if no ``wait()`` did."""
        with self._mutex:
            if self._failure is None or self._failure_delivered:
                return
            failure, raised, self._failure = self._failure, self._failure_raised, None
        if not raised:
            raise failure

    def _take_failure(self) -> CheckpointError | None:
        """``close()``'s end: the failure to raise (None: none, or a ``wait()`` raised it); a
        failure ``on_error`` took is returned too (nothing acted on it at a clean close)."""
        with self._mutex:
            failure, raised, self._failure = self._failure, self._failure_raised, None
        return None if raised else failure

def before_commit(durable: Callable[[], Any] | None, check: Callable[[], Any] | None) -> Callable[[], Any] | None:
    """What a commit runs right before it, on the writer thread: ``durable()`` (`start_save`),
    then ``check()`` (the writer's lock or lease: last, as close to the commit as it can be)."""
    if durable is None:
        return check

    def run() -> None:
        durable()
        if check is not None:
            check()
    return run
