"""Hooks that end training: `StopAtStepHook` (a step budget) and `StopAtSecsHook` (a time budget)."""
from __future__ import annotations

import logging
from typing import Any

from supervisor.clock import Clock, resolve_clock
from supervisor.hook import Hook, IdleUntil, RunContext, RunValues
from supervisor.toolkit import check_int, check_number

__all__ = ["StopAtStepHook", "StopAtSecsHook"]

logger = logging.getLogger(__name__)


class StopAtStepHook(Hook):
    """Requests a stop once the global step reaches a last step.

    ``num_steps`` counts from the global step at session creation, i.e. after a restore, and
    is computed once: a re-creation after a recoverable error does not extend the budget. A
    session created at or beyond the last step (a resumed run that already finished) stops
    before its first step. A session that ends cleanly before the last step (the data ran out,
    the loop ended, another hook or a signal stopped it) says so in one INFO line at `end`.

    Example::

        MonitoredSession(creator, hooks=[StopAtStepHook(last_step=10_000)])

    Args:
        num_steps: how many steps to run in this process.
        last_step: the global step to stop at.
    """

    def __init__(self, num_steps: int | None = None, last_step: int | None = None) -> None:
        if num_steps is None and last_step is None:
            raise ValueError("StopAtStepHook: one of num_steps or last_step must be given, e.g. "
                             "StopAtStepHook(last_step=10_000)")
        if num_steps is not None and last_step is not None:
            raise ValueError(f"StopAtStepHook: only one of num_steps or last_step can be given, got "
                             f"num_steps={num_steps!r} and last_step={last_step!r}")
        self._num_steps = check_int("num_steps", num_steps, minimum=1, allow_none=True)
        self._last_step = check_int("last_step", last_step, minimum=0, allow_none=True)

    @property
    def last_step(self) -> int | None:
        """The step training stops at (None until the session is created, with ``num_steps``)."""
        return self._last_step

    def after_create_session(self, session: Any, coord: Any) -> None:
        step = session.global_step
        if self._last_step is None:
            self._last_step = step + self._num_steps
        elif step >= self._last_step:
            logger.info("StopAtStepHook: the session starts at step %d, already at or beyond "
                        "last_step=%d; stopping before the first step", step, self._last_step)
            session.request_stop(reason=f"StopAtStepHook: already at step {step} >= last_step={self._last_step}",
                                 on_every_rank=True)  # every rank restored the same step

    def idle_until(self) -> IdleUntil | None:
        """The session skips this hook until the global step about to be taken reaches last_step."""
        return None if self._last_step is None else IdleUntil.step_reaches(self._last_step)

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if run_context.session.global_step >= self._last_step:
            run_context.request_stop(on_every_rank=True)  # every rank knows last_step

    def end(self, session: Any) -> None:
        step = session.global_step
        if self._last_step is None or step >= self._last_step:
            return
        reason = session.stop_reason or "the session closed"
        if "StopIteration" in reason:
            hint = ("the data ran out (StopIteration); to reach last_step, loop over epochs, e.g. "
                    "`while not s.should_stop(): for batch in loader: ...`, or use an endless iterator")
        elif "closed" in reason:
            hint = ("the `with` block ended while should_stop() was False; if the loop goes over the "
                    "data once, wrap it in `while not s.should_stop():`")
        else:
            hint = f"stopped by: {reason}"
        logger.info("StopAtStepHook: training ended at step %d, %d step(s) before last_step=%d: %s",
                    step, self._last_step - step, self._last_step, hint)

    def __repr__(self) -> str:
        return f"StopAtStepHook(last_step={self._last_step})"


class StopAtSecsHook(Hook):
    """Requests a stop once ``stop_after_secs`` have passed since `begin` (a time budget, e.g.
    to end cleanly with a final checkpoint before a job's wall-clock limit).

    Args:
        stop_after_secs: the budget, in seconds, counted on the clock's monotonic time.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, stop_after_secs: float, *, clock: Clock | None = None) -> None:
        self._stop_after_secs = check_number("stop_after_secs", stop_after_secs, strictly_positive=True)
        self._clock = resolve_clock(clock)
        self._deadline: float | None = None

    def begin(self) -> None:
        self._deadline = self._clock.monotonic() + self._stop_after_secs

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if self._clock.monotonic() >= self._deadline:
            logger.info("StopAtSecsHook: %.6g s have passed since the session began; stopping at step %d",
                        self._stop_after_secs, run_context.session.global_step)
            run_context.request_stop()

    def __repr__(self) -> str:
        return f"StopAtSecsHook(stop_after_secs={self._stop_after_secs})"
