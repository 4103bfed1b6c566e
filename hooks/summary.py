"""`SummarySaverHook`: the step function's scalar outputs as TensorBoard summaries."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable

from supervisor.clock import Clock
from supervisor.hook import Hook, IdleUntil, RunArgs, RunContext, RunValues, check_named_fetches, resolve_fetches
from supervisor.toolkit import (WriterSlot, check_bool, check_callable, check_schedule, describe_value, scalar_or_none,
                               scalars_of)

from hooks.timer import SecondOrStepTimer

__all__ = ["SummarySaverHook"]

logger = logging.getLogger(__name__)

#: The keyword argument `SummarySaverHook(feed_summarize=True)` passes to the step function.
SUMMARIZE_FEED = "summarize"


class SummarySaverHook(Hook):
    """Writes scalar summaries every N steps or seconds, at the step just taken (TF semantics).

    The first step after `begin` always writes, then the schedule applies: with
    ``save_steps=8`` from step 0, summaries land at steps 1, 9, 17, 25, ... . The first write
    is preceded by a ``SessionLog.START`` at that step, so TensorBoard drops what a crashed run
    wrote beyond the checkpoint this run resumed from.

    What is written, on a summary step:

    - ``fetches=None`` (default): every scalar in the step function's returned dict (a number
      or a 0-dim tensor/array; a step function returning one value writes it as
      ``loss``); any other value is skipped with a WARNING naming its key, once;
    - ``fetches=["loss", "lr"]`` or ``{"train/loss": "loss", "lr": lambda: sched.get_last_lr()[0]}``:
      those keys/callables under those tags (a non-scalar value is an error); ``()`` for none;
    - plus ``summary_fn(session) -> {tag: scalar}``, if given.

    At a clean close, if the step advanced since the last write, the last step's values are
    written too (a fetched key the last step did not return, e.g. one computed only with
    ``summarize=True``, is left out), so a run shorter than the interval still has a curve.

    With ``feed_summarize=True`` the step function is called with ``summarize=True`` on summary
    steps (and without it otherwise), so it computes expensive summaries only then::

        def train_step(batch, summarize=False):
            ...
            out = {"loss": loss}
            if summarize:
                out["grad_norm"] = total_grad_norm(model)
            return out

    Args:
        save_steps: write every this many steps (exactly one of ``save_steps``/``save_secs``).
        save_secs: write every this many seconds.
        output_dir: write through ``SummaryWriterCache.get(output_dir)``.
        summary_writer: write here (wins over ``output_dir``); with neither, the session's
            writer is used. Non-chief processes write nothing (unless given a writer).
        summary_fn: ``summary_fn(session) -> {tag: scalar}``, called on summary steps.
        fetches: which step outputs to write (see above).
        feed_summarize: feed ``summarize=True`` to the step function on summary steps.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, save_steps: int | None = None, save_secs: float | None = None, *,
                 output_dir: str | None = None, summary_writer: Any = None,
                 summary_fn: Callable[[Any], Mapping[str, Any]] | None = None, fetches: Any = None,
                 feed_summarize: bool = False, clock: Clock | None = None) -> None:
        every_steps, every_secs = check_schedule("SummarySaverHook", ("save_steps", save_steps),
                                                 ("save_secs", save_secs))
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=clock)
        self._slot = WriterSlot("SummarySaverHook", summary_writer, output_dir)
        self._summary_fn = check_callable("summary_fn", summary_fn, signature="summary_fn(session) -> {tag: scalar}")
        self._tags = _check_fetches(fetches)
        if self._tags == {} and summary_fn is None:
            raise ValueError("SummarySaverHook: fetches=() and no summary_fn leaves nothing to write; "
                             "pass fetches=None (every scalar output), a list of output keys, or a summary_fn")
        check_bool("feed_summarize", feed_summarize)
        feeds = {SUMMARIZE_FEED: True} if feed_summarize else None
        self._run_args = RunArgs(fetches=self._tags, feeds=feeds) if self._tags or feeds else None
        self._first = True
        self._request = False
        self._last_written: int | None = None
        self._warned: set[str] = set()  # step outputs already reported as not scalar

    def begin(self) -> None:
        self._first = True

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._slot.after_create_session(session)

    def idle_until(self) -> IdleUntil | None:
        """The session skips this hook until its schedule may trigger (`SecondOrStepTimer.idle_until`)."""
        return None if self._first else self._timer.idle_until()

    def before_run(self, run_context: RunContext) -> RunArgs | None:
        # The decision is about the step about to be taken: the post-increment step.
        self._request = self._first or self._timer.should_trigger_for_step(run_context.session.global_step + 1)
        if self._request and self._slot.writer is None:
            self._request = False  # nowhere to write (said once at creation): ask for nothing
        return self._run_args if self._request else None

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if not self._request:
            return
        self._request = False  # consumed: only the next before_run asks again
        writer = self._slot.writer
        session = run_context.session
        step = session.global_step
        if self._first:
            self._first = False
            writer.add_session_log("START", step)
        self._timer.update_last_triggered_step(step)
        self._write(session, run_values.results)

    def end(self, session: Any) -> None:
        writer = self._slot.writer
        if writer is None:
            return
        step = session.global_step
        if self._last_written is not None and step != self._last_written:
            self._write(session, self._final_results(session.last_output))
        writer.flush()

    def _write(self, session: Any, results: Any) -> None:
        values = self._collect(session, results)
        if values:
            self._slot.writer.add_scalars(values, session.global_step)
        self._last_written = session.global_step

    def _final_results(self, output: Any) -> dict[str, Any] | None:
        if self._tags is None:
            return None
        results = {}
        for tag, fetch in self._tags.items():
            try:
                results[tag] = resolve_fetches(fetch, output, self)
            except KeyError:
                logger.debug("SummarySaverHook: the last step did not return %r; not in the final summary", fetch)
        return results

    def _collect(self, session: Any, results: Any) -> dict[str, float]:
        if self._tags is None:
            values = scalars_of(session.last_output, self._warned, owner="SummarySaverHook")
        else:
            values = {}
            for tag, value in (results or {}).items():
                scalar = scalar_or_none(value)
                if scalar is None:
                    raise TypeError(f"SummarySaverHook: {tag!r} is {describe_value(value)}, not a number or a "
                                    "0-dim tensor; reduce it (e.g. .mean()) or leave it out of fetches")
                values[tag] = scalar
        if self._summary_fn is not None:
            extra = self._summary_fn(session)
            if not isinstance(extra, Mapping):
                raise TypeError(f"summary_fn must return a dict of tag -> scalar, got {extra!r}")
            values.update({tag: value for tag, value in extra.items()})
        return values


def _check_fetches(fetches: Any) -> dict[str, Any] | None:
    """Normalises ``fetches`` to ``{tag: fetch}``; None means "every scalar output"."""
    if fetches is None:
        return None
    return check_named_fetches("fetches", fetches, also="None (every scalar output), ")
