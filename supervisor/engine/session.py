"""`MonitoredSession`: the one engine behind every front door (SPEC §3).

It owns the global step, runs hooks at fixed points of every step (`supervisor.engine.dispatch`),
resolves save and stop requests at each step boundary (`supervisor.engine.boundary`, with the ranks'
`supervisor.agreement`), shares one stop condition (a `Coordinator`) with the service threads,
recovers from recoverable errors, and closes cleanly (``end`` hooks) or on an error
(``on_exception`` hooks, first error re-raised) — `supervisor.engine.lifecycle`.

Example::

    with MonitoredSession(SessionCreator(TrainingState({"model": net})),
                          hooks=[StopAtStepHook(last_step=100)]) as s:
        while not s.should_stop():
            s.run(train_step, next(batches))
"""
from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Mapping
from typing import Any, Callable

from supervisor import distributed
from supervisor._validate import check_bool, check_hooks, check_int, check_number
from supervisor._console import install_default_handler
from supervisor.agreement import Agreement
from supervisor.engine.boundary import StepBoundary
from supervisor.clock import Clock, resolve_clock
from supervisor.engine.coordinator import Coordinator
from supervisor.creators.base import SessionCreator
from supervisor.engine.dispatch import NO_RESULTS, Dispatch, merge_feeds, results_of
from supervisor.distributed.agreement import CollectiveAgreement
from supervisor.errors import RecoverableError
from supervisor.hook import Hook, RunArgs, RunContext, RunValues, StepContext, check_run_args
from supervisor.engine.lifecycle import SessionLifecycle, check_exception_types
from supervisor.engine.session_requests import SessionRequests
from supervisor.state.resume import loader_generators
from supervisor.state.rng import capture_rng_state
from supervisor.engine.signals import SignalHandlers

__all__ = ["MonitoredSession", "StepContext", "check_exception_types"]

logger = logging.getLogger(__name__)


class MonitoredSession(SessionRequests, SessionLifecycle):
    """Runs steps through hooks, with init-or-recover, stop agreement and clean shutdown.

    Args:
        session_creator: makes the training state ready (`SessionCreator`; its checkpoint-aware
            subclass restores from a log directory). Default: an empty in-memory state.
        hooks: `Hook` instances, called in list order.
        stop_grace_secs: how long threads may take to stop at close before they are named in
            the error.
        recoverable_exceptions: exception types that re-create the session and retry the step.
        max_recoveries: how many recoveries in a row (without a successful step between them)
            before the error is re-raised.
        recovery_backoff_secs: wait before the first re-creation; doubled each consecutive
            recovery, at most 60 s.
        handle_signals: install SIGTERM/SIGINT handlers that request a clean stop (main thread
            only; restored at close). A second SIGINT raises `KeyboardInterrupt` at once.
        coord: the coordinator to share with service threads (default: a new one). A recovery
            clears it (same object, so front doors and threads keep their reference).
        agreement: how this process's save/stop requests become the decision at each step
            boundary (`supervisor.agreement.Agreement`; default: the identity on one process, a
            `CollectiveAgreement` under ``torch.distributed``).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    _recovery_enabled = True
    _in_step_fn = False

    def __init__(
        self,
        session_creator: SessionCreator | None = None,
        hooks: Any = (),
        *,
        stop_grace_secs: float = 120,
        recoverable_exceptions: Any = (RecoverableError,),
        max_recoveries: int = 10,
        recovery_backoff_secs: float = 1.0,
        handle_signals: bool = False,
        coord: Coordinator | None = None,
        agreement: Agreement | None = None,
        clock: Clock | None = None,
    ) -> None:
        _check_instances(session_creator=session_creator, coord=coord, agreement=agreement)
        self._creator = session_creator if session_creator is not None else SessionCreator()
        self._hooks: list[Hook] = check_hooks("hooks", hooks)
        self._stop_grace_secs = check_number("stop_grace_secs", stop_grace_secs, minimum=0)
        self._recoverable = check_exception_types(recoverable_exceptions) if self._recovery_enabled else ()
        self._max_recoveries = check_int("max_recoveries", max_recoveries, minimum=0)
        self._backoff_secs = check_number("recovery_backoff_secs", recovery_backoff_secs, minimum=0)
        check_bool("handle_signals", handle_signals)
        self._clock = resolve_clock(clock)
        self._dispatch = Dispatch(self._hooks)
        self._global_step = 0
        self._last_output: Any = None
        self._coord = coord if coord is not None else Coordinator()
        self._stop_event = self._coord.stop_event
        if agreement is None and distributed.is_distributed():  # §12: every rank, same step
            agreement = self._collective_agreement()
        self._boundary = StepBoundary(agreement)
        # A collective agreement must be called at every boundary, the same number of times on
        # every rank; the local one only when something was requested.
        self._resolve_every_step = not self._boundary.agreement.local
        self._signalled = threading.Event()
        self._signal_reason = ""
        self._training_thread = threading.current_thread()
        self._signals = SignalHandlers(self._on_signal) if handle_signals else None
        install_default_handler()  # a restore, a stop and progress show without configuring logging
        self._begin()

    def _collective_agreement(self) -> CollectiveAgreement:
        # A sharded (DCP) manager writes each rank's RNG file itself: no gather to the chief.
        return CollectiveAgreement(stop_grace_secs=max(self._stop_grace_secs, 1.0),
                                   capture_rng=self.capture_rng, gather_rng=not self._creator.checkpoints_per_rank,
                                   modules=tuple(self._creator.state.objects.values()))

    # ---------------------------------------------------------------- properties
    @property
    def global_step(self) -> int:
        return self._global_step

    @property
    def state(self) -> Mapping[str, Any]:
        """Read-only view of the training state (name -> stateful object)."""
        return self._creator.state.objects

    @property
    def training_state(self) -> Any:
        """The `TrainingState` itself (what checkpoint managers save and restore)."""
        return self._creator.state

    @property
    def logdir(self) -> str | None:
        return self._creator.logdir

    @property
    def is_chief(self) -> bool:
        return self._creator.is_chief

    @property
    def summary_writer(self) -> Any:
        """The summary writer, or None when this session does not write summaries."""
        return self._creator.summary_writer

    @property
    def coord(self) -> Coordinator:
        """The coordinator of the current session incarnation (new after each recovery)."""
        return self._coord

    @property
    def checkpoint_manager(self) -> Any:
        """The checkpoint manager of this session, or None when it does not write checkpoints."""
        return self._creator.checkpoints

    @property
    def hooks(self) -> tuple[Hook, ...]:
        return tuple(self._hooks)

    @property
    def dispatch(self) -> Dispatch:
        """Which hooks each step calls (`supervisor.engine.dispatch.Dispatch`)."""
        return self._dispatch

    @property
    def stop_reason(self) -> str | None:
        """Why the session stopped, naming the source (a hook's class, a signal, a thread, an
        error...), or None while running."""
        return self._boundary.stop_reason

    @property
    def preempted(self) -> bool:
        """Whether a signal (SIGTERM/SIGINT) stopped this session: the run is not finished and
        should be resumed (exit non-zero, e.g. 143, so a scheduler requeues the job)."""
        return self._boundary.preempted

    @property
    def boundary(self) -> StepBoundary:
        """The step boundary where this session resolves save and stop requests (SPEC §3.5)."""
        return self._boundary

    @property
    def last_output(self) -> Any:
        """What the latest successful step function returned."""
        return self._last_output

    @property
    def closed(self) -> bool:
        return self._closed

    def capture_rng(self) -> Any:
        """This rank's RNG state as its checkpoint stores it (gathered at agreed saves, §12)."""
        return capture_rng_state(loader_generators(self._creator.state))

    # ---------------------------------------------------------------- stepping
    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one step: ``before_run`` hooks, ``fn(*args, **kwargs, **feeds)``, global step
        + 1, ``after_run`` hooks, then the step boundary. Returns what ``fn`` returned."""
        if self._boundary.stopped or self._closed:
            self._refuse_run()
        while True:
            start_step = self._global_step
            try:
                if self._stop_event.is_set():
                    self._coord.raise_requested_exception()  # a thread's error (recoverable: recover)
                output = self._run_once(fn, args, kwargs)
            except self._recoverable as exc:
                if self._in_step_fn:
                    raise  # run_step_fn re-runs the whole step_fn
                self._recover(exc, start_step)
                continue
            if self._recoveries:
                self._recoveries = 0
            if self._stop_event.is_set() and not self._in_step_fn:
                self._recover_reported_error()
            return output

    def run_step_fn(self, step_fn: Callable[[StepContext], Any]) -> Any:
        """Runs ``step_fn(step_context)`` (TF's ``run_step_fn``); recoverable errors retry it."""
        names = [p.name for p in inspect.signature(step_fn).parameters.values()] if callable(step_fn) else None
        if names != ["step_context"]:
            raise ValueError(
                f"step_fn must take exactly one argument named step_context, got {step_fn!r} "
                f"with arguments {names}; define it as def step_fn(step_context): ..."
            )
        if self._boundary.stopped or self._closed:
            self._refuse_run()
        while True:
            start_step = self._global_step
            self._in_step_fn = True
            try:
                output = step_fn(StepContext(self))
            except self._recoverable as exc:
                self._in_step_fn = False
                self._recover(exc, start_step)
                continue
            finally:
                self._in_step_fn = False
            if self._recoveries:
                self._recoveries = 0
            if self._stop_event.is_set():
                self._recover_reported_error()
            return output

    def _run_once(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        d, b = self._dispatch, self._boundary
        gated = self._global_step + 1 < d.gate_step and (d.gate_clock is None or d.gate_clock() < d.gate_time)
        before, after = (d.open_before, d.open_after) if gated else (d.before_hooks, d.after_hooks)
        if before or after:
            return self._run_through_hooks(fn, args, kwargs, before, after, gated)
        self._in_step = True
        output = fn(*args, **kwargs)
        self._global_step += 1
        self._in_step = False
        self._last_output = output
        # Inlined, as in _run_through_hooks (`Dispatch.time_gate_opened`): in a real training loop
        # this code runs from cold caches every step, and each Python call costs there.
        if gated and d.gate_clock is not None and d.gate_clock() >= d.gate_time:
            self._after_run(RunContext(fn, args, kwargs, self), d.after_hooks, None)
            d.regate(self._global_step + 1)  # a time gate opened during the step: its hooks see this step
        if b.pending or self._resolve_every_step or b.actions_pending or self._stop_event.is_set():
            b.at_boundary(self)
        return output

    def _run_through_hooks(self, fn: Callable[..., Any], args: tuple, kwargs: dict,
                           before: list[Hook], after: list[Hook], gated: bool) -> Any:
        d = self._dispatch
        self._in_step = True
        context = RunContext(fn, args, kwargs, self)
        fetches: dict[int, Any] | None = None
        feeds: dict[str, Any] | None = None
        for hook in before:
            run_args = hook.before_run(context)
            if run_args is None:
                continue
            if type(run_args) is not RunArgs:  # a clear TypeError, not AttributeError: 'list'...
                run_args = check_run_args(hook, run_args)
            if run_args.fetches is not None:
                if fetches is None:
                    fetches = {}
                fetches[id(hook)] = run_args.fetches
            if run_args.feeds:
                if feeds is None:
                    feeds, feeders = {}, {}
                merge_feeds(feeds, feeders, run_args.feeds, hook, kwargs)
        output = fn(*args, **kwargs, **feeds) if feeds else fn(*args, **kwargs)
        self._global_step += 1
        self._after_increment = True
        self._last_output = output
        results = results_of(before, fetches, output) if fetches else None
        if gated and d.gate_clock is not None and d.gate_clock() >= d.gate_time:
            after, gated = d.after_hooks, False  # a time gate opened during the step
        self._after_run(context, after, results)
        if not gated and d.scheduled:
            d.regate(self._global_step + 1)
        b = self._boundary
        if b.pending or self._resolve_every_step or b.actions_pending or self._stop_event.is_set():
            b.at_boundary(self)
        return output

    def _after_run(self, context: RunContext, after: list[Hook], results: dict | None) -> None:
        """``after_run`` of ``after`` for the step that just ran; a stop request goes to the boundary."""
        self._in_step = self._after_increment = True
        stopper = None
        for hook in after:
            hook.after_run(context, RunValues(results.get(id(hook))) if results else NO_RESULTS)
            if stopper is None and context.stop_requested:
                stopper = hook
        self._in_step = self._after_increment = False
        if stopper is not None:
            self._boundary.request_stop(f"{type(stopper).__name__} requested stop at step {self._global_step}",
                                        on_every_rank=context.stop_on_every_rank)

    def _recover_reported_error(self) -> None:
        """A recoverable error a thread reported during the step that just ended is recovered
        at its boundary, as TF's ``_RecoverableSession`` checks after the run (SPEC §3.5): the
        session is re-created now, so ``should_stop()`` stays False and the next ``run`` (or a
        ``close``) finds a running session, not the error."""
        exc = self._coord.exception
        if exc is not None and isinstance(exc, self._recoverable) and not self._boundary.stopped and not self._closed:
            self._recover(exc, self._global_step)

    def _refuse_run(self) -> None:
        if self._closed:
            raise RuntimeError("run called on a closed session")
        self._coord.raise_requested_exception()
        raise RuntimeError("run called after should_stop was requested")


def _check_instances(*, session_creator: Any, coord: Any, agreement: Any) -> None:
    if agreement is not None and not isinstance(agreement, Agreement):
        raise TypeError(f"agreement must be a supervisor.engine.boundary.Agreement or None, got {agreement!r}")
    if coord is not None and not isinstance(coord, Coordinator):
        raise TypeError(f"coord must be a supervisor.Coordinator or None, got {coord!r}")
    if session_creator is not None and not isinstance(session_creator, SessionCreator):
        raise TypeError(f"session_creator must be a supervisor.SessionCreator, got {session_creator!r}")
