"""What a `MonitoredSession` is asked to do between or during its steps (SPEC §3.5): stop, save,
listen to saves, act at a boundary — the session's request API over its `StepBoundary`.

`SessionRequests` is the part of `MonitoredSession` that hooks, service threads, signals and the
user's loop call; the session inherits it. During a step every call only *requests*; the step's
boundary resolves the requests (`supervisor.engine.boundary`). On the training thread between two steps
the session is at a boundary, so a save or (one process) a stop happens at once.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from supervisor._validate import check_bool

if TYPE_CHECKING:
    from supervisor.engine.boundary import StepBoundary
    from supervisor.engine.coordinator import Coordinator
    from supervisor.creators.base import SessionCreator

__all__ = ["SessionRequests"]


class SessionRequests:
    """Stop and save requests, boundary actions, checkpoint listeners (see the module docstring)."""

    _boundary: StepBoundary
    _coord: Coordinator
    _creator: SessionCreator
    _stop_event: threading.Event
    _training_thread: threading.Thread
    _signalled: threading.Event
    _signal_reason: str
    _recoverable: tuple[type[BaseException], ...]
    _global_step: int
    _closed: bool
    _creating: bool
    _in_step: bool
    _after_increment: bool

    def should_stop(self) -> bool:
        """True once a step boundary decided to stop (or an error stopped the session).

        A stop requested during a step (a hook, a thread, a signal) takes effect at that step's
        boundary; one requested between steps by another thread or a signal, at the next
        boundary — so the final checkpoint never holds a data position one batch ahead.
        """
        if self._boundary.stopped or self._closed:
            return True
        if self._stop_event.is_set():
            exc = self._coord.exception
            return exc is not None and not isinstance(exc, self._recoverable)
        return False

    @property
    def stop_requested(self) -> bool:
        """Whether a stop is decided or requested (it takes effect at the next step boundary).
        Code that waits on the runtime's behalf (e.g. for the chief) ends its wait on this."""
        b = self._boundary
        return b.stopped or self._closed or self._stop_event.is_set() or b.stop_pending

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
            self._boundary.note_stop_reason(f"{type(exc).__name__}: {exc}")
            self._coord.request_stop(exc)
            return
        reason = reason or "request_stop() called"
        self._boundary.request_stop(reason, on_every_rank=on_every_rank)
        if self._at_boundary_now(every_rank=on_every_rank):
            self._boundary.at_boundary(self)
        else:
            self._coord.request_stop(None)

    def _on_signal(self, *, reason: str) -> None:
        self._boundary.mark_preempted()
        self._signal_reason = reason
        self._signalled.set()  # ends a recovery's backoff at once
        self._boundary.request_stop(reason, preempted=True)  # the agreement carries it to every rank
        self._coord.request_stop(None)  # the coordinator's event ends the runtime's waits now

    def request_save(self, reason: str, *, manager: Any = None, on_every_rank: bool = False) -> None:
        """Asks for a checkpoint at the next step boundary (thread-safe); ``manager`` defaults to
        the session's. Skipped when the state on disk is already at that step.

        ``on_every_rank=True`` says every rank of a distributed job requests this save at this
        same step (a step schedule they all run): it is then captured at this step's boundary,
        not one step later through the agreement. Wrong if some rank does not ask: that rank
        would not take part in the save's collectives (RNG gather, sharded writes)."""
        self._boundary.request_save(reason, manager, on_every_rank=on_every_rank)

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

    def call_at_boundary(self, action: Callable[[Any], Any]) -> None:
        """Runs ``action(session)`` on the training thread after the next step (thread-safe).
        This is how services act on a consistent state, e.g. a checkpoint capture."""
        self._boundary.call_at_boundary(action)

    def call_when_stopping(self, action: Callable[[Any], Any]) -> None:
        """Runs ``action(session)`` once, on the training thread, at the boundary of the step
        during which a stop was requested (by a hook, a signal, a thread or `request_stop`).

        This is where final checkpoints are captured: at close the loop may already have taken
        the next batch from a stateful loader (``for batch in loader: if s.should_stop():
        break``), and a checkpoint taken then would resume one batch too far. Registrations are
        per session creation (call it from ``after_create_session``).
        """
        self._boundary.call_when_stopping(action)

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
            manager = self._own_manager()
        if not self._at_boundary_now() and not self._creating:
            if wait:
                raise RuntimeError("save_checkpoint(wait=True) cannot wait during a step (the capture "
                                   "happens at the step's boundary); call it between two run() calls")
            step = self._global_step + (1 if self._in_step and not self._after_increment else 0)
            self._boundary.request_save("save_checkpoint() during a step", manager)
            return manager.path_of(step)
        return self._boundary.capture(self, manager, self._global_step, "save_checkpoint()",
                                      wait=wait, creation=self._creating)

    def _own_manager(self) -> Any:
        manager = self._creator.checkpoints
        # A collective manager (checkpoint_format="dcp") saves on every rank (§12).
        if manager is None or not (self._creator.is_chief or self._creator.checkpoints_per_rank):
            why = "is not the chief" if not self._creator.is_chief else "has no checkpoint directory"
            raise RuntimeError(f"save_checkpoint: this session {why}; only the chief of a session "
                               "with a logdir/checkpoint_dir writes checkpoints")
        return manager

    def _at_boundary_now(self, *, every_rank: bool = False) -> bool:
        """Whether the caller is the training thread between two steps (a step boundary that
        resolves now: with a distributed agreement, only what every rank asks there)."""
        return (not self._in_step and not self._creating and not self._closed
                and (self._boundary.agreement.local or every_rank)
                and threading.current_thread() is self._training_thread)
