"""`StepCounterHook`: the step rate, as the ``global_step/sec`` summary and an INFO line
(``step 300: 12.5 steps/sec, loss = 0.53``: TF's default progress line, with the step's scalar
outputs)."""
from __future__ import annotations

import logging
from typing import Any

from supervisor.clock import Clock
from supervisor.hook import Hook, IdleUntil, RunContext, RunValues
from supervisor.toolkit import WriterSlot, check_bool, check_schedule, scalars_of

from hooks.timer import SecondOrStepTimer

__all__ = ["StepCounterHook"]

logger = logging.getLogger(__name__)

_MAX_STALL_WARNINGS = 5
_MAX_SHOWN = 4  # step outputs shown in the INFO line


class StepCounterHook(Hook):
    """Writes ``global_step/sec`` every N steps or seconds (TF semantics).

    The first trigger after each session creation only starts the measurement, so with
    ``every_n_steps=10`` from step 0 the rate is written at steps 11, 21, ... . A step that
    does not advance the global step is reported at WARNING (the first few times).

    Args:
        every_n_steps: write every this many steps (None to schedule by seconds).
        every_n_secs: write every this many seconds.
        output_dir: write through ``SummaryWriterCache.get(output_dir)``.
        summary_writer: write here (wins over ``output_dir``); with neither, the session's
            writer is used. Non-chief processes write nothing (unless given a writer).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
        log_progress: write the INFO line too (False: the summary only; the front doors pass
            False while a progress bar shows the same).
    """

    def __init__(self, every_n_steps: int | None = 100, every_n_secs: float | None = None, *,
                 output_dir: str | None = None, summary_writer: Any = None, clock: Clock | None = None,
                 log_progress: bool = True) -> None:
        every_steps, every_secs = check_schedule("StepCounterHook", ("every_n_steps", every_n_steps),
                                                 ("every_n_secs", every_n_secs))
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=clock)
        self._slot = WriterSlot("StepCounterHook", summary_writer, output_dir)
        self._last_step: int | None = None
        self._stall_warnings = 0
        self._log_progress = check_bool("log_progress", log_progress)
        self.tag = "global_step/sec"

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._slot.after_create_session(session)
        # A re-created session restarts the measurement: the time spent recovering is no step rate.
        self._last_step = None
        self._timer.reset()

    def idle_until(self) -> IdleUntil | None:
        """The session skips this hook until its schedule may trigger (the session advances the
        step every run, so no stall goes unseen in between)."""
        return self._timer.idle_until()

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        step = run_context.session.global_step
        if step == self._last_step:
            self._warn_stalled(step)
        self._last_step = step
        if self._timer.should_trigger_for_step(step):
            elapsed_secs, elapsed_steps = self._timer.update_last_triggered_step(step)
            if elapsed_secs is not None:
                self._record(elapsed_steps, elapsed_secs, step, getattr(run_context.session, "last_output", None))

    def _record(self, elapsed_steps: int, elapsed_secs: float, step: int, output: Any = None) -> None:
        if elapsed_secs <= 0:
            logger.debug("StepCounterHook: no time has passed over %d steps; no rate at step %d",
                         elapsed_steps, step)
            return
        steps_per_sec = elapsed_steps / elapsed_secs
        writer = self._slot.writer
        if writer is not None:
            writer.add_scalar(self.tag, steps_per_sec, step)
        if not self._log_progress:
            return
        outputs = "".join(f", {key} = {value:.4g}" for key, value in list(scalars_of(output).items())[:_MAX_SHOWN])
        logger.info("step %d: %.4g steps/sec%s", step, steps_per_sec, outputs)

    def _warn_stalled(self, step: int) -> None:
        if self._stall_warnings < _MAX_STALL_WARNINGS:
            self._stall_warnings += 1
            logger.warning("the global step has not advanced: it is still %d after a step; rates "
                           "and step-based schedules stall until it does", step)
