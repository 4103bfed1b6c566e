"""A session's life outside its steps (SPEC §3.1, §3.4, §3.6): create with retries, recover,
close cleanly or on an error.

`SessionLifecycle` is the part of `MonitoredSession` that creates, re-creates and closes it
(the session inherits it; the state it works on is the session's own). The rules:

- **create**: ``begin`` hooks once, then the creator initialises or restores the training state,
  ``after_create_session`` hooks, and the exact-resume RNG states are re-applied. A recoverable
  error during creation is retried like a failed step.
- **recover**: stop and join the threads, wait `backoff_secs` (a SIGTERM ends the wait), clear
  the coordinator and the boundary, re-create at the step the failed run started from. Never in
  a distributed job (the other ranks cannot follow): the error is re-raised and torchrun restarts.
- **close**: the last boundary (the final checkpoint), join the threads, wait for the saves in
  flight, ``end`` hooks; **close on error**: stop everything, ``on_exception`` hooks, re-raise the
  first error (the agreement may replace it with one naming the rank that failed first).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from supervisor.state import resume
from supervisor.agreement import Agreement
from supervisor.clock import Clock, system_clock
from supervisor.engine.coordinator import Coordinator, overdue_warning
from supervisor.summary import SummaryWriterCache

if TYPE_CHECKING:
    from supervisor.engine.boundary import StepBoundary
    from supervisor.creators.base import SessionCreator
    from supervisor.engine.dispatch import Dispatch
    from supervisor.engine.signals import SignalHandlers

__all__ = ["MAX_BACKOFF_SECS", "SessionLifecycle", "backoff_secs", "check_exception_types", "close_agreement"]

# The part of MonitoredSession that creates, recovers and closes it logs under the session's name.
logger = logging.getLogger("supervisor.engine.session")

MAX_BACKOFF_SECS = 60.0


def backoff_secs(first_secs: float, recoveries: int, *, cap_secs: float = MAX_BACKOFF_SECS) -> float:
    """The wait before the ``recoveries``-th re-creation in a row (1-based): ``first_secs``,
    doubled each time, at most ``cap_secs``."""
    return min(first_secs * 2 ** (recoveries - 1), cap_secs)


def close_agreement(agreement: Agreement, error: BaseException) -> BaseException:
    """Closes the agreement after ``error``; a collective one tells the other ranks why. Returns
    the error to raise: ``error``, or one naming the rank that failed first (chained to it)."""
    try:
        return agreement.close(error) or error
    except Exception:  # noqa: BLE001 - the first error is the one the user must see
        logger.exception("closing the rank agreement failed after %s", type(error).__name__)
        return error


class SessionLifecycle:
    """Creation, recovery and closing of a `MonitoredSession` (see the module docstring)."""

    _creator: SessionCreator
    _dispatch: Dispatch
    _boundary: StepBoundary
    _coord: Coordinator
    _clock: Clock
    _signals: SignalHandlers | None
    _signalled: threading.Event
    _signal_reason: str
    _recoverable: tuple[type[BaseException], ...]
    _max_recoveries: int
    _backoff_secs: float
    _stop_grace_secs: float
    _global_step: int
    _recoveries: int = 0
    _creating: bool = False
    _closed: bool = False
    _in_step: bool = False
    _after_increment: bool = False

    def _begin(self) -> None:
        """``begin`` hooks, then the first creation; on an error, the close on error."""
        try:
            for hook in self._dispatch.overriding("begin"):
                hook.begin()
            self._create_with_retries(self._global_step)
        except BaseException as exc:
            first = self._close_on_error(exc)
            first.__suppress_context__ = True  # keep __cause__ (e.g. a CheckpointError's OSError)
            raise first.with_traceback(first.__traceback__)

    # ---------------------------------------------------------------- creation and recovery
    def _create_session(self) -> None:
        self._boundary.clear_stop_actions()
        self._dispatch.reset()  # after_create_session resets the schedules: ask again
        self._creating = True
        resume.begin_creation(self._creator.state)  # exact resume: see reinstate() below
        try:
            step = self._creator.create(self)
            if step is not None:
                self._global_step = int(step)
            for hook in self._dispatch.overriding("after_create_session"):
                hook.after_create_session(self, self._coord)
            # Exact resume: re-apply the restored RNG state, whatever creation drew (supervisor/state/resume.py).
            resume.reinstate(self._creator.state)
        finally:
            self._creating = False
        boundary = self._boundary
        if boundary.pending and (boundary.agreement.local or boundary.only_every_rank_requests):
            boundary.at_boundary(self)  # creation is a boundary: e.g. a hook stopping before the first step

    def _create_with_retries(self, start_step: int) -> None:
        """Creates the session; a recoverable error during creation (``init_fn``, reading a
        checkpoint...) is retried like a failed step, within the same bound and backoff."""
        while True:
            try:
                self._create_session()
                return
            except self._recoverable as exc:
                self._prepare_recovery(exc, start_step)

    def _recover(self, exc: BaseException, start_step: int) -> None:
        """Re-creates the session after a recoverable error in a step, a hook or a thread."""
        self._prepare_recovery(exc, start_step)
        self._create_with_retries(start_step)

    def _prepare_recovery(self, exc: BaseException, start_step: int) -> None:
        if not self._boundary.agreement.local:
            # The other ranks are inside this step's collectives (DDP's all-reduce, the agreement):
            # a re-creation on this rank alone would restore a step they have left behind.
            logger.error("recoverable error at step %d (%s: %s) in a distributed job: not recovered "
                         "in this process — the other ranks cannot re-create with it; the job ends, "
                         "and torchrun --max-restarts=N restarts every rank from the last committed "
                         "checkpoint", start_step, type(exc).__name__, exc)
            raise exc.with_traceback(exc.__traceback__)
        self._recoveries += 1
        if self._recoveries > self._max_recoveries:
            logger.warning("giving up after %d recoveries in a row at step %d",
                           self._max_recoveries, start_step)
            raise exc.with_traceback(exc.__traceback__)
        backoff = backoff_secs(self._backoff_secs, self._recoveries)
        logger.warning("recoverable error at step %d (%s: %s); re-creating the session in %.1f s "
                       "(recovery %d of at most %d)", start_step, type(exc).__name__, exc,
                       backoff, self._recoveries, self._max_recoveries)
        self._join_threads_for_recovery(exc)
        self._wait_backoff(backoff)
        self._coord.clear_stop()
        self._in_step = self._after_increment = False
        self._global_step = start_step
        self._boundary.clear()
        if self._signalled.is_set():  # a signal's stop outlives the recovery
            self._boundary.request_stop(self._signal_reason, preempted=True)

    def _join_threads_for_recovery(self, exc: BaseException) -> None:
        self._coord.request_stop()
        try:
            self._coord.join(stop_grace_secs=self._stop_grace_secs)
        except BaseException as joined:  # noqa: BLE001 - the recorded error is the one recovered from
            if joined is not exc and not isinstance(joined, self._recoverable):
                raise

    def _wait_backoff(self, secs: float) -> None:
        # The coordinator is stopped (its threads are joined), so a signal is watched separately:
        # a SIGTERM during the backoff ends the wait and stops at the first boundary after it.
        # (An injected test clock's sleep passes its time at once: nothing to interrupt.)
        if self._clock is system_clock:
            self._signalled.wait(secs)
        else:
            self._clock.sleep(secs)

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Closes cleanly: stops and joins threads, runs ``end`` hooks, releases resources.
        Re-raises an exception a thread recorded. Closing twice raises `RuntimeError`."""
        self._close(None)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, StopIteration):
            self._boundary.request_stop("StopIteration (data exhausted)")
            exc = None
        self._close(exc)
        return exc_type is not None  # only reached for StopIteration: swallow it

    def _close(self, exc: BaseException | None) -> None:
        if self._closed:
            raise RuntimeError("session is already closed")
        if exc is None and self._coord.exception is not None:
            exc = self._coord.exception  # a thread failed: this is an error close
        if exc is not None:
            first = self._close_on_error(exc)
            if first is exc:
                raise exc
            raise first.with_traceback(first.__traceback__)
        try:
            self._close_cleanly()
        except BaseException as error:
            first = self._close_on_error(error)
            first.__suppress_context__ = True
            raise first.with_traceback(first.__traceback__)
        self._closed = True
        if self._signals is not None:
            self._signals.restore()
        try:
            self._creator.shutdown(failed=False)
        finally:
            # Hooks given ``output_dir=`` write through cached writers nobody else flushes (SPEC §9).
            SummaryWriterCache.flush_all()

    def _close_cleanly(self) -> None:
        boundary = self._boundary
        if not boundary.stopped:  # the close is the stopping boundary (final capture)
            if not boundary.stop_pending:  # every rank closes at the same step (§12)
                boundary.request_stop("session closed", on_every_rank=True)
            boundary.at_boundary(self)
        boundary.agreement.close()
        self._coord.request_stop()
        self._coord.join(stop_grace_secs=self._stop_grace_secs)
        boundary.flush(self)
        for hook in self._dispatch.overriding("end"):
            with overdue_warning(f"{type(hook).__name__}.end()", self._stop_grace_secs):
                hook.end(self)

    def _close_on_error(self, exc: BaseException) -> BaseException:
        """Stops everything after ``exc``; returns the first exception, to be re-raised."""
        self._closed = True
        self._boundary.note_stop_reason(f"{type(exc).__name__}: {exc}")
        first = self._join_after_error(exc)
        first = close_agreement(self._boundary.agreement, first)  # may name the failed rank (§12)
        for hook in self._dispatch.overriding("on_exception"):
            try:
                with overdue_warning(f"{type(hook).__name__}.on_exception()", self._stop_grace_secs):
                    hook.on_exception(self, first)
            except Exception:  # noqa: BLE001 - cleanup must reach every hook
                logger.exception("%s.on_exception failed while closing after %s",
                                 type(hook).__name__, type(first).__name__)
        if self._signals is not None:
            self._signals.restore()
        try:
            self._creator.shutdown(failed=True)
        except Exception:  # noqa: BLE001 - the first error is the one the user must see
            logger.exception("closing the session creator failed after %s", type(first).__name__)
        SummaryWriterCache.flush_all()  # what the hooks wrote before the error (SPEC §9)
        return first

    def _join_after_error(self, exc: BaseException) -> BaseException:
        """Stops and joins the threads; the first exception, with a straggler's note."""
        if not self._coord.joined:
            self._coord.request_stop(exc)
        straggler_error = None
        try:
            self._coord.join(stop_grace_secs=self._stop_grace_secs)
        except RuntimeError as err:
            if err is not self._coord.exception:
                straggler_error = err
        except BaseException:  # noqa: BLE001 - it is the recorded first exception, kept below
            pass
        first = self._coord.exception or exc
        if straggler_error is not None and hasattr(first, "add_note"):
            first.add_note(str(straggler_error))
        return first
def check_exception_types(types: Any, name: str = "recoverable_exceptions") -> tuple[type[BaseException], ...]:
    """Validates a tuple of exception types (one type alone is accepted)."""
    given = types
    if isinstance(types, type):
        types = (types,)
    if isinstance(types, (str, bytes)) or not isinstance(types, (tuple, list, set, frozenset)):
        types = None
    else:
        types = tuple(types)
    if types is None or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise TypeError(f"{name} must be a tuple of exception types such as "
                        f"(supervisor.RecoverableError,), got {given!r}")
    return types
