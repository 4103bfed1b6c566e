"""`MonitoredSession`: the one engine behind every front door (SPEC §3).

It owns the global step, runs hooks at fixed points of every step, shares one stop condition
(a `Coordinator`) with the service threads, recovers from recoverable errors, and closes
cleanly (``end`` hooks) or on an error (``on_exception`` hooks, first error re-raised).

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
from types import MappingProxyType
from typing import Any, Callable

from supervisor import resume
from supervisor._validate import check_bool, check_hooks, check_int, check_number
from supervisor import distributed
from supervisor.boundary import Agreement, StepBoundary
from supervisor.clock import Clock, resolve_clock, system_clock
from supervisor.coordinator import Coordinator, overdue_warning
from supervisor.creator import SessionCreator
from supervisor.errors import RecoverableError
from supervisor.hook import Hook, RunArgs, RunContext, RunValues, check_run_args, overrides, resolve_fetches
from supervisor.signals import SignalHandlers
from supervisor.summary import SummaryWriterCache

__all__ = ["MonitoredSession", "StepContext", "check_exception_types"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF_SECS = 60.0


class StepContext:
    """What ``run_step_fn``'s ``step_fn(step_context)`` receives (TF's ``StepContext``)."""

    __slots__ = ("session", "_monitored")

    def __init__(self, monitored: MonitoredSession) -> None:
        self.session = monitored
        self._monitored = monitored

    def run_with_hooks(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One step through the hooks: ``session.run(fn, *args, **kwargs)``."""
        return self._monitored.run(fn, *args, **kwargs)

    def request_stop(self) -> None:
        """Ends the session cleanly at once: raises `StopIteration`, which the ``with`` swallows
        after running ``end`` hooks. No per-step hook runs for the rest of this step."""
        self._monitored._boundary.request_stop("step_fn requested stop")
        raise StopIteration("step_fn has requested the iterations to stop")


_NO_RESULTS = RunValues(None)  # immutable: one for every hook of every step that fetched nothing


def _gateable(hook: Hook) -> bool:
    """Whether ``hook``'s ``before_run``/``after_run`` are those its ``_gate`` describes: not
    when a subclass overrides them (it may do work on every step)."""
    def owner(name: str) -> type | None:
        return next((c for c in type(hook).__mro__ if name in c.__dict__), None)

    schedule = owner("_gate")
    if schedule is None or not callable(getattr(hook, "_gate", None)):
        return False
    return all(owner(name) in (schedule, Hook) for name in ("before_run", "after_run"))


class MonitoredSession:
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
            boundary (`supervisor.boundary.Agreement`; default: the identity, one process).
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
        if agreement is not None and not isinstance(agreement, Agreement):
            raise TypeError(f"agreement must be a supervisor.boundary.Agreement or None, got {agreement!r}")
        if coord is not None and not isinstance(coord, Coordinator):
            raise TypeError(f"coord must be a supervisor.Coordinator or None, got {coord!r}")
        if session_creator is not None and not isinstance(session_creator, SessionCreator):
            raise TypeError(
                f"session_creator must be a supervisor.SessionCreator, got {session_creator!r}"
            )
        self._creator = session_creator if session_creator is not None else SessionCreator()
        self._hooks: list[Hook] = check_hooks("hooks", hooks)
        self._stop_grace_secs = check_number("stop_grace_secs", stop_grace_secs, minimum=0)
        self._recoverable = check_exception_types(recoverable_exceptions) if self._recovery_enabled else ()
        self._max_recoveries = check_int("max_recoveries", max_recoveries, minimum=0)
        self._backoff_secs = check_number("recovery_backoff_secs", recovery_backoff_secs, minimum=0)
        check_bool("handle_signals", handle_signals)
        self._clock = resolve_clock(clock)

        self._before_hooks = [h for h in self._hooks if overrides(h, "before_run")]
        self._after_hooks = [h for h in self._hooks if overrides(h, "after_run")]
        # Scheduled hooks (the built-in ones: ``_gate()``) are not called on the steps before
        # their schedule may trigger: a loop with the default hooks calls no hook on most steps.
        # Every hook is called again from step `_gate_step` or once `_gate_now()` reaches
        # `_gate_time`, whichever comes first (see _regate).
        self._gated = [h for h in self._hooks if _gateable(h)
                       and (h in self._before_hooks or h in self._after_hooks)]
        self._open_before = [h for h in self._before_hooks if h not in self._gated]
        self._open_after = [h for h in self._after_hooks if h not in self._gated]
        self._gate_step: float = 0
        self._gate_now: Callable[[], float] | None = None
        self._gate_time = 0.0
        self._global_step = 0
        self._last_output: Any = None
        self._coord = coord if coord is not None else Coordinator()
        self._stop_event = self._coord.stop_event
        if agreement is None and distributed.is_distributed():  # §12: every rank, same step
            from supervisor.distributed.agreement import CollectiveAgreement

            # A sharded (DCP) manager writes each rank's RNG file itself: no gather to the chief.
            sharded = getattr(getattr(self._creator, "checkpoints", None), "collective", False)
            agreement = CollectiveAgreement(stop_grace_secs=max(self._stop_grace_secs, 1.0),
                                            capture_rng=self._capture_rng, gather_rng=not sharded,
                                            modules=tuple(getattr(self._creator, "state", {}).values()))
        self._boundary = StepBoundary(agreement)
        # A collective agreement must be called at every boundary, the same number of times on
        # every rank; the local one only when something was requested.
        self._resolve_every_step = not self._boundary.agreement.local
        self._stop_reason: str | None = None
        self._stopped = False  # a boundary decided the stop: should_stop() is True
        self._preempted = False
        self._signalled = threading.Event()
        self._signal_reason = ""
        self._closed = False
        self._in_step = False
        self._creating = False
        self._training_thread = threading.current_thread()
        self._recoveries = 0
        self._boundary_lock = threading.Lock()
        self._boundary_actions: list[Callable[[MonitoredSession], Any]] = []
        self._stop_actions: list[Callable[[MonitoredSession], Any]] = []
        self._signals = SignalHandlers(self._on_signal) if handle_signals else None
        try:
            for hook in self._hooks_overriding("begin"):
                hook.begin()
            self._create_with_retries(self._global_step)
        except BaseException as exc:
            first = self._close_on_error(exc)
            first.__suppress_context__ = True  # keep __cause__ (e.g. a CheckpointError's OSError)
            raise first.with_traceback(first.__traceback__)

    # ---------------------------------------------------------------- properties
    @property
    def global_step(self) -> int:
        return self._global_step

    @property
    def state(self) -> Mapping[str, Any]:
        """Read-only view of the training state (name -> stateful object)."""
        return MappingProxyType(self._creator.state._objects)

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
    def stop_reason(self) -> str | None:
        """Why the session stopped, naming the source (a hook's class, a signal, a thread, an
        error...), or None while running."""
        return self._stop_reason

    @property
    def preempted(self) -> bool:
        """Whether a signal (SIGTERM/SIGINT) stopped this session: the run is not finished and
        should be resumed (exit non-zero, e.g. 143, so a scheduler requeues the job)."""
        return self._preempted

    @property
    def stop_requested(self) -> bool:
        """Whether a stop is decided or requested (it takes effect at the next step boundary).
        Code that waits on the runtime's behalf (e.g. for the chief) ends its wait on this."""
        return self._stopped or self._closed or self._stop_event.is_set() or self._boundary.stop_pending

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

    # ---------------------------------------------------------------- stepping
    def should_stop(self) -> bool:
        """True once a step boundary decided to stop (or an error stopped the session).

        A stop requested during a step (a hook, a thread, a signal) takes effect at that step's
        boundary; one requested between steps by another thread or a signal, at the next
        boundary — so the final checkpoint never holds a data position one batch ahead.
        """
        if self._stopped or self._closed:
            return True
        if self._stop_event.is_set():
            exc = self._coord.exception
            return exc is not None and not isinstance(exc, self._recoverable)
        return False

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None,
                     on_every_rank: bool = False) -> None:
        """Ends training; an ``exc`` is re-raised at close. ``reason`` becomes `stop_reason`
        (the first stop's reason wins).

        Called on the training thread between two steps, the stop takes effect at once (this is
        a step boundary: the final checkpoint is captured now). Called during a step (from a
        hook or the step function) or from another thread, it takes effect at the step's
        boundary. With a distributed agreement every rank stops at the same step; a stop every
        rank requests at the same point (``on_every_rank=True``, e.g. `StopAtStepHook` finding
        the restored step past ``last_step``) applies there, with no step more.
        """
        if exc is not None:
            self._request_stop(exc, reason=f"{type(exc).__name__}: {exc}")
            return
        reason = reason or "request_stop() called"
        if self._at_boundary_now(every_rank=on_every_rank):
            self._boundary.request_stop(reason, stop_on_every_rank=on_every_rank)
            self._at_boundary()
        else:
            self._boundary.request_stop(reason, stop_on_every_rank=on_every_rank)
            self._coord.request_stop(None)

    def request_save(self, reason: str, *, manager: Any = None, on_every_rank: bool = False) -> None:
        """Asks for a checkpoint at the next step boundary (thread-safe); ``manager`` defaults to
        the session's. Skipped when the state on disk is already at that step.

        ``on_every_rank=True`` says every rank of a distributed job requests this save at this
        same step (a step schedule they all run): it is then captured at this step's boundary,
        not one step later through the agreement. Wrong if some rank does not ask: that rank
        would not take part in the save's collectives (RNG gather, sharded writes)."""
        self._boundary.request_save(reason, manager, save_on_every_rank=on_every_rank)

    def add_checkpoint_listener(self, listener: Any, *, manager: Any = None) -> None:
        """Registers a `hooks.CheckpointSaverListener` for the checkpoints of ``manager``
        (default: the session's): ``before_save`` at each capture, ``after_save`` when the
        commit is delivered at a later boundary. Registrations last one session creation
        (call it from ``after_create_session``)."""
        manager = manager if manager is not None else self._creator.checkpoints
        if manager is None:
            raise RuntimeError("add_checkpoint_listener: this session has no checkpoint manager to listen to")
        self._boundary.add_listener(listener, manager)

    def save_at_stop(self, manager: Any = None) -> None:
        """Captures a final checkpoint through ``manager`` (default: the session's) at the
        boundary where the session stops, unless that step is already saved. Registrations
        last one session creation."""
        manager = manager if manager is not None else self._creator.checkpoints
        if manager is not None:
            self._boundary.save_at_stop(manager)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs one step: ``before_run`` hooks, ``fn(*args, **kwargs, **feeds)``, global step
        + 1, ``after_run`` hooks, then the step boundary. Returns what ``fn`` returned."""
        if self._stopped or self._closed:
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

    def _recover_reported_error(self) -> None:
        """A recoverable error a thread reported during the step that just ended is recovered
        at its boundary, as TF's ``_RecoverableSession`` checks after the run (SPEC §3.5): the
        session is re-created now, so ``should_stop()`` stays False and the next ``run`` (or a
        ``close``) finds a running session, not the error."""
        exc = self._coord.exception
        if exc is not None and isinstance(exc, self._recoverable) and not self._stopped and not self._closed:
            self._recover(exc, self._global_step)

    def run_step_fn(self, step_fn: Callable[[StepContext], Any]) -> Any:
        """Runs ``step_fn(step_context)`` (TF's ``run_step_fn``); recoverable errors retry it."""
        names = [p.name for p in inspect.signature(step_fn).parameters.values()] if callable(step_fn) else None
        if names != ["step_context"]:
            raise ValueError(
                f"step_fn must take exactly one argument named step_context, got {step_fn!r} "
                f"with arguments {names}; define it as def step_fn(step_context): ..."
            )
        if self._stopped or self._closed:
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

    def call_at_boundary(self, action: Callable[[MonitoredSession], Any]) -> None:
        """Runs ``action(session)`` on the training thread after the next step (thread-safe).
        This is how services act on a consistent state, e.g. a checkpoint capture."""
        with self._boundary_lock:
            self._boundary_actions.append(action)

    def call_when_stopping(self, action: Callable[[MonitoredSession], Any]) -> None:
        """Runs ``action(session)`` once, on the training thread, at the boundary of the step
        during which a stop was requested (by a hook, a signal, a thread or `request_stop`).

        This is where final checkpoints are captured: at close the loop may already have taken
        the next batch from a stateful loader (``for batch in loader: if s.should_stop():
        break``), and a checkpoint taken then would resume one batch too far. Registrations are
        per session creation (call it from ``after_create_session``).
        """
        self._stop_actions.append(action)

    def save_checkpoint(self, wait: bool = False, *, manager: Any = None) -> str:
        """Checkpoints now, at this step boundary, through the commit protocol; returns the
        checkpoint's path. ``wait=True`` blocks until it is committed.

        Between two ``run`` calls (e.g. at an epoch end) the capture happens at once. Called
        during a step (a hook, the step function) it is a request for this step's boundary,
        and the returned path is the one that checkpoint will have.
        """
        check_bool("wait", wait)
        if self._closed:
            raise RuntimeError("save_checkpoint: the session is closed; save inside the `with` "
                               "block, e.g. at the end of an epoch")
        if manager is None:
            manager = self._creator.checkpoints
            # A collective manager (checkpoint_format="dcp") saves on every rank (§12).
            if manager is None or not (self._creator.is_chief or getattr(manager, "collective", False)):
                why = "is not the chief" if not self._creator.is_chief else "has no checkpoint directory"
                raise RuntimeError(f"save_checkpoint: this session {why}; only the chief of a session "
                                   "with a logdir/checkpoint_dir writes checkpoints")
        if not self._at_boundary_now() and not self._creating:
            if wait:
                raise RuntimeError("save_checkpoint(wait=True) cannot wait during a step (the capture "
                                   "happens at the step's boundary); call it between two run() calls")
            step = self._global_step + (1 if self._in_step and not self._after_increment else 0)
            self._boundary.request_save("save_checkpoint() during a step", manager)
            return manager.path_of(step)
        return self._boundary.capture(self, manager, self._global_step, "save_checkpoint()",
                                      wait=wait, creation=self._creating)

    def _after_hooks_once(self, context: RunContext, after: list[Hook], results: dict | None) -> None:
        """``after_run`` of ``after`` for the step that just ran; a stop request goes to the boundary."""
        self._in_step = self._after_increment = True
        stopper = None
        for hook in after:
            hook.after_run(context, RunValues(results.get(id(hook))) if results else _NO_RESULTS)
            if stopper is None and context._stop_requested:
                stopper = hook
        self._in_step = self._after_increment = False
        if stopper is not None:
            self._boundary.request_stop(f"{type(stopper).__name__} requested stop at step {self._global_step}",
                                        stop_on_every_rank=context._stop_on_every_rank)

    def _time_gate_opened(self) -> bool:
        """Whether a time-gated hook's deadline passed during the step that just ran."""
        return self._gate_now is not None and self._gate_now() >= self._gate_time

    def _regate(self) -> None:
        """After a step that called every hook: which scheduled hooks are idle until when.

        A hook's ``_gate()`` is ``("step", n)`` (idle while the step about to be taken is before
        ``n``), ``("time", monotonic, t)`` (idle while ``monotonic() < t``) or None (active).
        Until the first gate opens the session calls only the other hooks; then every hook once,
        and this again. Calling a hook more often than needed is always correct, so anything
        unsure (time gates on different clocks) stays active."""
        upcoming = self._global_step + 1
        idle = []
        step_gate, now, time_gate = float("inf"), None, float("inf")
        for hook in self._gated:
            gate = hook._gate()  # type: ignore[attr-defined]
            if gate is None:
                continue
            if gate[0] == "step" and gate[1] > upcoming:
                idle.append(hook)
                step_gate = min(step_gate, gate[1])
            elif gate[0] == "time" and (now is None or gate[1] == now) and gate[1]() < gate[2]:
                idle.append(hook)
                now, time_gate = gate[1], min(time_gate, gate[2])
        self._gate_step = step_gate if idle else 0
        self._gate_now, self._gate_time = now, time_gate
        if idle:
            self._open_before = [h for h in self._before_hooks if h not in idle]
            self._open_after = [h for h in self._after_hooks if h not in idle]

    def _at_boundary_now(self, *, every_rank: bool = False) -> bool:
        """Whether the caller is the training thread between two steps (a step boundary that
        resolves now: with a distributed agreement, only what every rank asks there)."""
        return (not self._in_step and not self._creating and not self._closed
                and (self._boundary.agreement.local or every_rank)
                and threading.current_thread() is self._training_thread)

    _after_increment = False

    def _run_once(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        gated = self._global_step + 1 < self._gate_step and (self._gate_now is None or self._gate_now() < self._gate_time)
        before, after = (self._open_before, self._open_after) if gated else (self._before_hooks, self._after_hooks)
        if not before and not after:
            self._in_step = True
            output = fn(*args, **kwargs)
            self._global_step += 1
            self._in_step = False
            self._last_output = output
            # Inlined, as below (`_time_gate_opened`, `Boundary.pending`): in a real training loop
            # this code runs from cold caches every step, and each Python call costs there.
            if gated and self._gate_now is not None and self._gate_now() >= self._gate_time:
                self._after_hooks_once(RunContext(fn, args, kwargs, self), self._after_hooks, None)
                self._regate()  # a time gate opened during the step: its hooks see this step
            if self._boundary._pending or self._resolve_every_step or self._boundary_actions or self._stop_event.is_set():
                self._at_boundary()
            return output
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
                _merge_feeds(feeds, feeders, run_args.feeds, hook, kwargs)
        output = fn(*args, **kwargs, **feeds) if feeds else fn(*args, **kwargs)
        self._global_step += 1
        self._after_increment = True
        self._last_output = output
        results = {key: resolve_fetches(f, output, hook) for hook in before
                   if (f := fetches.get(key := id(hook))) is not None} if fetches else None
        if gated and self._time_gate_opened():
            after, gated = self._after_hooks, False  # a time gate opened during the step
        self._after_hooks_once(context, after, results)
        if not gated and self._gated:
            self._regate()
        if self._boundary._pending or self._resolve_every_step or self._boundary_actions or self._stop_event.is_set():
            self._at_boundary()
        return output

    def _at_boundary(self) -> None:
        """Resolves the requests of the step that just ended (`supervisor.boundary`)."""
        if self._boundary_actions:
            with self._boundary_lock:
                actions, self._boundary_actions = self._boundary_actions, []
            for action in actions:
                action(self)
        if self._stop_event.is_set() and not self._stopped:
            if self._coord.exception is not None:
                return  # an error: should_stop() is True, close re-raises it (or run() recovers)
            if not self._boundary.stop_pending:
                self._boundary.request_stop(self._coord.describe_stop())
        decision = self._boundary.resolve(self, self._global_step)
        if decision.stop and not self._stopped:
            self._preempted = self._preempted or decision.preempted  # a signal on any rank (§12)
            self._apply_stop(decision.stop_reason or "stop requested")

    def _apply_stop(self, reason: str) -> None:
        self._stopped = True
        if self._stop_reason is None:
            self._stop_reason = reason
        logger.info("stopping at step %d: %s", self._global_step, self._stop_reason)
        for action in self._stop_actions:
            action(self)
        self._coord.request_stop()  # service threads end

    def _refuse_run(self) -> None:
        if self._closed:
            raise RuntimeError("run called on a closed session")
        self._coord.raise_requested_exception()
        raise RuntimeError("run called after should_stop was requested")

    def _capture_rng(self) -> Any:
        """This rank's RNG state as its checkpoint stores it (gathered at agreed saves, §12)."""
        from supervisor.resume import loader_generators
        from supervisor.rng import capture_rng_state

        return capture_rng_state(loader_generators(self._creator.state))

    def _request_stop(self, exc: BaseException | None = None, *, reason: str) -> None:
        """A stop requested from any thread: an error stops at once (``exc``); a clean stop is
        resolved at the next boundary. The coordinator's event ends the runtime's waits now."""
        if exc is not None:
            if self._stop_reason is None:
                self._stop_reason = reason
        else:
            self._boundary.request_stop(reason)
        self._coord.request_stop(exc)

    def _on_signal(self, *, reason: str) -> None:
        if not self._stopped:
            self._preempted = True
        self._signal_reason = reason
        self._signalled.set()  # ends a recovery's backoff at once
        self._boundary.request_stop(reason, preempted=True)  # the agreement carries it to every rank
        self._request_stop(reason=reason)

    # ---------------------------------------------------------------- creation and recovery
    def _hooks_overriding(self, method: str) -> list[Hook]:
        return [h for h in self._hooks if overrides(h, method)]

    def _create_session(self) -> None:
        self._stop_actions.clear()
        self._gate_step, self._gate_now = 0, None  # after_create_session resets the schedules: ask again
        self._creating = True
        resume.begin_creation(self._creator.state)  # exact resume: see reinstate() below
        try:
            step = self._creator.create(self)
            if step is not None:
                self._global_step = int(step)
            for hook in self._hooks_overriding("after_create_session"):
                hook.after_create_session(self, self._coord)
            # Exact resume: re-apply the restored RNG state, whatever creation drew (supervisor/resume.py).
            resume.reinstate(self._creator.state)
        finally:
            self._creating = False
        if self._boundary.pending and (self._boundary.agreement.local or self._boundary.only_every_rank_requests):
            self._at_boundary()  # creation is a boundary: e.g. a hook stopping before the first step

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
        backoff = min(self._backoff_secs * 2 ** (self._recoveries - 1), _MAX_BACKOFF_SECS)
        logger.warning("recoverable error at step %d (%s: %s); re-creating the session in %.1f s "
                       "(recovery %d of at most %d)", start_step, type(exc).__name__, exc,
                       backoff, self._recoveries, self._max_recoveries)
        self._coord.request_stop()
        try:
            self._coord.join(stop_grace_secs=self._stop_grace_secs)
        except BaseException as joined:  # noqa: BLE001 - the recorded error is the one recovered from
            if joined is not exc and not isinstance(joined, self._recoverable):
                raise
        # The coordinator is stopped (its threads are joined), so a signal is watched separately:
        # a SIGTERM during the backoff ends the wait and stops at the first boundary after it.
        # (An injected test clock's sleep passes its time at once: nothing to interrupt.)
        if self._clock is system_clock:
            self._signalled.wait(backoff)
        else:
            self._clock.sleep(backoff)
        self._coord.clear_stop()
        self._in_step = self._after_increment = False
        self._global_step = start_step
        with self._boundary_lock:
            self._boundary_actions.clear()
        self._boundary.clear()
        if self._signalled.is_set():  # a signal's stop outlives the recovery
            self._boundary.request_stop(self._signal_reason, preempted=True)

    # ---------------------------------------------------------------- closing
    def close(self) -> None:
        """Closes cleanly: stops and joins threads, runs ``end`` hooks, releases resources.
        Re-raises an exception a thread recorded. Closing twice raises `RuntimeError`."""
        self._close(None)

    def __enter__(self) -> MonitoredSession:
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
            if not self._stopped:  # the close is the stopping boundary (final capture)
                if not self._boundary.stop_pending:  # every rank closes at the same step (§12)
                    self._boundary.request_stop("session closed", stop_on_every_rank=True)
                self._at_boundary()
            self._boundary.agreement.close()
            self._coord.request_stop()
            self._coord.join(stop_grace_secs=self._stop_grace_secs)
            self._boundary.flush(self)
            for hook in self._hooks_overriding("end"):
                with overdue_warning(f"{type(hook).__name__}.end()", self._stop_grace_secs):
                    hook.end(self)
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

    def _close_on_error(self, exc: BaseException) -> BaseException:
        """Stops everything after ``exc``; returns the first exception, to be re-raised."""
        self._closed = True
        if self._stop_reason is None:
            self._stop_reason = f"{type(exc).__name__}: {exc}"
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
        first = _close_agreement(self._boundary.agreement, first)  # may name the failed rank (§12)
        for hook in self._hooks_overriding("on_exception"):
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


def _close_agreement(agreement: Agreement, error: BaseException) -> BaseException:
    """Closes the agreement after ``error``; a collective one tells the other ranks why. Returns
    the error to raise: ``error``, or one naming the rank that failed first (chained to it)."""
    try:
        return agreement.close(error) or error
    except Exception:  # noqa: BLE001 - the first error is the one the user must see
        logger.exception("closing the rank agreement failed after %s", type(error).__name__)
        return error


def _merge_feeds(feeds: dict, feeders: dict, new: Mapping[str, Any], hook: Hook, kwargs: dict) -> None:
    if not isinstance(new, Mapping):
        raise TypeError(f"{type(hook).__name__}.before_run returned feeds={new!r}; feeds must be a dict")
    for name, value in new.items():
        if name in kwargs:
            raise RuntimeError(f"{type(hook).__name__} feeds {name!r}, which the caller of run() "
                               "already passed; the step was not run")
        if name in feeders:
            raise RuntimeError(f"{type(feeders[name]).__name__} and {type(hook).__name__} both feed "
                               f"{name!r}; the step was not run")
        feeds[name] = value
        feeders[name] = hook


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
