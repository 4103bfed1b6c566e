"""The `Supervisor`'s time-based services, run as one internal hook (SPEC §6, §9).

At every session creation the hook writes TensorBoard's ``SessionLog.START`` at the session's
step (TensorBoard then drops events a crashed run wrote beyond it, so a resumed curve has no
duplicates), saves a checkpoint if the state is not already the one on disk, and starts its
`LooperThread`s on the session's coordinator:

- checkpoint service: every ``save_model_secs`` it asks for a checkpoint, captured on the
  training thread at the next step boundary (a consistent cut) and written in the background;
- summary service: every ``save_summaries_secs`` it writes the scalars of the latest step's
  output and what ``summary_fn(session)`` returns (called on the service thread);
- step counter: every ``save_summaries_secs`` it writes ``global_step/sec`` (0.0 on the first
  tick; a stalled loop shows as 0, which a hook-only design cannot see).

The final checkpoint is taken at the boundary of the step during which the stop was
requested (`MonitoredSession.save_at_stop`, SPEC §3.5), so a loop that fetched one more batch
from a stateful loader before seeing the stop does not checkpoint past it; a session closed
without a stopping boundary (data exhausted) captures at close if the step changed.
"""
from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any, Callable

from supervisor.clock import Clock
from supervisor.coordinator import Coordinator, LooperThread
from supervisor.hook import SINGLE_OUTPUT_KEY, Hook

__all__ = ["SupervisorServices", "scalars_of", "save_if_changed"]

logger = logging.getLogger(__name__)


def scalars_of(output: Any) -> dict[str, float]:
    """The scalars of a step's output: every number or one-element tensor in a returned dict
    (a single returned value counts as ``"loss"``)."""
    if output is None:
        return {}
    items = output.items() if isinstance(output, Mapping) else ((SINGLE_OUTPUT_KEY, output),)
    scalars = {}
    for tag, value in items:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            scalars[str(tag)] = float(value)
        elif getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
            scalars[str(tag)] = float(value.item())
    return scalars


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
                 summary_fn: Callable[[Any], Mapping[str, Any]] | None, clock: Clock) -> None:
        self._save_model_secs = save_model_secs
        self._save_summaries_secs = save_summaries_secs
        self._summary_fn = summary_fn
        self._clock = clock
        self._session: Any = None
        self._last_summary_step: int | None = None
        self._last_count: tuple[int, float] | None = None

    def after_create_session(self, session: Any, coord: Coordinator) -> None:
        self._session = session
        writer = session.summary_writer
        if writer is not None:
            writer.add_session_log("START", session.global_step)
        if session.checkpoint_manager is not None:
            session.save_at_stop()  # the final checkpoint, at the stopping step's boundary
        if session.checkpoint_manager is not None and self._save_model_secs:
            save_if_changed(session)
            self._loop(coord, self._save_model_secs, self._request_checkpoint, "checkpoint", skip_first=True)
        if writer is not None and self._save_summaries_secs:
            self._last_count = None
            self._loop(coord, self._save_summaries_secs, self._write_summaries, "summaries")
            self._loop(coord, self._save_summaries_secs, self._count_steps, "step-counter")

    def end(self, session: Any) -> None:
        # The final checkpoint was captured at the stopping boundary and committed before `end`.
        if session.summary_writer is not None:
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
        scalars = scalars_of(session.last_output)
        if self._summary_fn is not None:
            extra = self._summary_fn(session)
            if extra:
                if not isinstance(extra, Mapping):
                    raise TypeError(f"summary_fn must return a dict of tag -> scalar, got {extra!r}")
                scalars.update(extra)
        if scalars:
            session.summary_writer.add_scalars(scalars, step)
        self._last_summary_step = step

    def _count_steps(self) -> None:
        session = self._session
        step, now = session.global_step, self._clock.monotonic()
        if self._last_count is None:
            rate = 0.0
        else:
            last_step, last_time = self._last_count
            rate = (step - last_step) / (now - last_time) if now > last_time else 0.0
        session.summary_writer.add_scalar("global_step/sec", rate, step)
        self._last_count = (step, now)
