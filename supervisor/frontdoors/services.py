"""The `Supervisor`'s time-based services, run as one internal hook (SPEC §6, §9).

At every session creation the hook writes TensorBoard's ``SessionLog.START`` at the first
step this session takes (the restored step + 1), saves a checkpoint if the state is not already
the one on disk, and starts its `LooperThread`s on the session's coordinator. TensorBoard drops
every event at and after a START's step: a crashed run's events beyond its last checkpoint are
hidden (the resumed curve has no duplicates), while the point at the restored step — written
after the step that produced the checkpoint, so it describes that state — is kept. (A START at
the restored step itself would hide the previous run's last point; `SummarySaverHook` writes its
START at the same step, its first summary step.) The services are:

- checkpoint service: every ``save_model_secs`` it asks for a checkpoint, captured on the
  training thread at the next step boundary (a consistent cut) and written in the background;
- summary service: every ``save_summaries_secs`` it writes the scalars of the latest step's
  output and what ``summary_fn(session)`` returns (called on the service thread); a step output
  that is not a scalar is left out with a WARNING naming its key, once;
- step counter: every ``save_summaries_secs`` it writes ``global_step/sec`` at the current
  step, when the step advanced since its last point: never two points at one step (a tick
  that sees no new step writes nothing). The first tick after each session start only starts
  the measurement (a rate needs two points, and a 0.0 there would draw every resume as a
  stall). No step over a whole interval — and over ten steps' time at the session's mean
  rate (ten intervals before a rate is known), so a step a little slower than a short interval
  is no stall — is a stall, which a hook-only design cannot see: it is written once as 0.0 at the
  stalled step (the one in progress, ``global_step + 1``), with a WARNING (the first few
  times); the next point's rate covers the stall.

At a clean close, if the step advanced since the last tick, a final summary (step outputs,
``summary_fn``, and the step rate since the last tick) is written at the last step, so a run
shorter than ``save_summaries_secs`` still shows its curves. That last rate runs to the
boundary where the session stopped, not to the close: the final checkpoint's commit is not
training time.

The final checkpoint is taken at the boundary of the step during which the stop was
requested (`MonitoredSession.save_at_stop`, SPEC §3.5), so a loop that fetched one more batch
from a stateful loader before seeing the stop does not checkpoint past it; a session closed
without a stopping boundary (data exhausted) captures at close if the step changed.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable

from supervisor._scalars import scalars_of
from supervisor.clock import Clock
from supervisor.engine.coordinator import Coordinator, LooperThread
from supervisor.hook import Hook

__all__ = ["SupervisorServices", "save_if_changed"]

logger = logging.getLogger(__name__)

_MAX_STALL_WARNINGS = 5
_STALL_STEPS = 10  # no step for this many steps' time (and a whole interval) is a stall
_MIN_STALL_SECS = 2.0  # ...and for at least this long: a busy machine's scheduler pauses are shorter


def save_if_changed(session: Any, *, wait: bool = False) -> str | None:
    """Checkpoints the session unless its step is already saved. Returns the checkpoint path,
    or None when nothing was saved. (The CHECKPOINT session log is written when the commit is
    delivered at a step boundary.)"""
    manager = session.checkpoint_manager
    if manager is None or manager.last_saved_step == session.global_step:
        return None
    return session.save_checkpoint(wait=wait)


class SupervisorServices(Hook):
    """The internal hook that runs the `Supervisor`'s services for one session."""

    def __init__(self, *, save_model_secs: float, save_summaries_secs: float,
                 summary_fn: Callable[[Any], Mapping[str, Any]] | None, clock: Clock, progress_line: bool = True) -> None:
        self._save_model_secs = save_model_secs
        self._save_summaries_secs = save_summaries_secs
        self._summary_fn = summary_fn
        self._clock = clock
        self._progress_line = progress_line  # False while a progress bar shows the same
        self._session: Any = None
        self._last_summary_step: int | None = None
        self._last_count: tuple[int, float] | None = None  # (step, when this step was first seen)
        self._last_point_step: int | None = None  # the step of the last global_step/sec point
        self._stalls = 0  # stalls drawn: the first few are WARNINGs
        self._first_count: tuple[int, float] = (0, 0.0)  # (step, time) of this session's first tick
        self._mean_rate: float | None = None  # steps/sec since then (sets the stall time)
        self._stopped_at: tuple[int, float] | None = None  # (step, monotonic) of the stopping boundary
        self._warned: set[str] = set()  # step outputs already reported as not scalar

    def after_create_session(self, session: Any, coord: Coordinator) -> None:
        self._session = session
        writer = session.summary_writer
        if writer is not None:
            writer.add_session_log("START", session.global_step + 1)
        if session.checkpoint_manager is not None:
            session.save_at_stop()  # the final checkpoint, at the stopping step's boundary
        if session.checkpoint_manager is not None and self._save_model_secs:
            save_if_changed(session)
            self._loop(coord, self._save_model_secs, self._request_checkpoint, "checkpoint", skip_first=True)
        if writer is not None and self._save_summaries_secs:
            self._stopped_at = None
            session.call_when_stopping(self._mark_stop)
            self._last_count = None
            # A resumed session has nothing new at the restored step until it takes a step (the
            # previous run's close summarised it; a duplicate point there would draw a zigzag).
            self._last_summary_step = session.global_step if session.global_step > 0 else None
            self._loop(coord, self._save_summaries_secs, self._write_summaries, "summaries")
            self._loop(coord, self._save_summaries_secs, self._count_steps, "step-counter")

    def end(self, session: Any) -> None:
        # The final checkpoint was captured at the stopping boundary and committed before `end`.
        if session.summary_writer is not None:
            if self._save_summaries_secs:  # the service threads are joined: no tick races this
                self._write_summaries()
                self._count_steps(final=True)
            session.summary_writer.flush()

    def _loop(self, coord: Coordinator, interval_secs: float, target: Callable[[], None],
              name: str, skip_first: bool = False) -> None:
        if skip_first:  # the first tick's work was just done on the training thread
            first = [True]
            inner = target

            def target() -> None:
                if first:
                    first.clear()
                else:
                    inner()

        LooperThread(coord, interval_secs, target, clock=self._clock, name=f"supervisor-{name}").start()

    def _request_checkpoint(self) -> None:
        self._session.request_save(f"save_model_secs={self._save_model_secs:g} elapsed")

    def _write_summaries(self) -> None:
        session = self._session
        step = session.global_step
        if step == self._last_summary_step:
            return  # nothing new since the last tick
        scalars = scalars_of(session.last_output, self._warned, owner="Supervisor summaries")
        if self._summary_fn is not None:
            extra = self._summary_fn(session)
            if extra:
                if not isinstance(extra, Mapping):
                    raise TypeError(f"summary_fn must return a dict of tag -> scalar, got {extra!r}")
                scalars.update(extra)
        if scalars:
            session.summary_writer.add_scalars(scalars, step)
        self._last_summary_step = step

    def _mark_stop(self, session: Any) -> None:
        self._stopped_at = (session.global_step, self._clock.monotonic())

    def _count_steps(self, final: bool = False) -> None:
        """One tick of the step counter (SPEC §9): a point only at a step that has none yet."""
        session = self._session
        step, now = session.global_step, self._clock.monotonic()
        stopped = self._stopped_at
        if stopped is not None and stopped[0] == step:
            # After the stop (a tick before the service threads ended, or the final one at close)
            # the rate runs to the stopping boundary: the final checkpoint's commit and the rest
            # of the close are not training time (counted, they drew a dip at every run's end).
            now = min(now, stopped[1])
        if self._last_count is None:  # the first tick of this session: start measuring
            if not final:
                self._last_count = self._first_count = (step, now)
                self._last_point_step, self._mean_rate = None, None
            return
        last_step, last_time = self._last_count
        if step == last_step:
            if not final and now - last_time >= self._stall_secs():
                self._write_stall(step)
            return
        if step != self._last_point_step and now > last_time:  # (not the step a stall was drawn at)
            first_step, first_time = self._first_count
            self._mean_rate = (step - first_step) / (now - first_time)  # since this session's start
            rate = (step - last_step) / (now - last_time)
            session.summary_writer.add_scalar("global_step/sec", rate, step)
            if self._progress_line:
                _log_progress(step, rate, getattr(session, "last_output", None))
            self._last_point_step = step
        self._last_count = (step, now)

    def _stall_secs(self) -> float:
        """How long without a step is a stall: a whole interval, at least ten steps' time at
        this session's mean rate (ten intervals before a rate is known), and at least 2 s, so a
        step a little longer than a short interval, or a pause of a loaded machine's scheduler
        (the quickstart's 0.1 s interval: pauses of 0.6-0.8 s were drawn as 0), is not drawn as
        0. The mean, not the last point's rate: that one swings with bursts."""
        interval = self._save_summaries_secs
        if not self._mean_rate:
            return max(_STALL_STEPS * interval, _MIN_STALL_SECS)
        return max(interval, _STALL_STEPS / self._mean_rate, _MIN_STALL_SECS)

    def _write_stall(self, step: int) -> None:
        """No step for a whole interval: the step in progress (``step + 1``) has stalled. Drawn
        as 0.0 once, at that step: the point at ``step`` is the rate that led up to it, and a
        second point there would draw a vertical line. When the stalled step completes, its
        rate is not written again; the next point measures from ``step``, stall included."""
        if self._last_point_step == step + 1:
            return  # this stall is drawn already
        self._session.summary_writer.add_scalar("global_step/sec", 0.0, step + 1)
        self._last_point_step = step + 1
        self._stalls += 1
        level = logging.WARNING if self._stalls <= _MAX_STALL_WARNINGS else logging.DEBUG
        logger.log(level, "the global step has not advanced for %g s (still %d): global_step/sec = 0 at step %d",
                   self._clock.monotonic() - self._last_count[1], step, step + 1)


def _log_progress(step: int, rate: float, output: Any) -> None:
    """TF's progress line at each step-rate point: ``step 300: 12.5 steps/sec, loss = 0.53``."""
    shown = list(scalars_of(output).items())[:4]
    logger.info("step %d: %.4g steps/sec%s", step, rate, "".join(f", {k} = {v:.4g}" for k, v in shown))
