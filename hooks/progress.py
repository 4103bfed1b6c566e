"""`ProgressBarHook`: a tqdm progress bar, or periodic INFO lines when tqdm is not installed."""
from __future__ import annotations

import datetime
import logging
from typing import Any

from supervisor.clock import Clock, resolve_clock
from supervisor.hook import Hook, RunArgs, RunContext, RunValues, check_named_fetches
from supervisor.toolkit import check_bool, check_int, check_schedule, scalar_or_none, scalars_of

from hooks.stop import StopAtStepHook
from hooks.timer import SecondOrStepTimer

try:  # tqdm is an optional extra (``torch-supervisor[progress]``)
    from tqdm.auto import tqdm as _auto_tqdm

    class _tqdm(_auto_tqdm):  # type: ignore[misc,valid-type]
        # tqdm's monitor thread outlives every bar (it is never joined); the bar is updated
        # every step anyway, so it has nothing to do here.
        monitor_interval = 0

except ImportError:  # pragma: no cover - exercised by patching _tqdm to None
    _tqdm = None

__all__ = ["ProgressBarHook"]

logger = logging.getLogger(__name__)

_DEFAULT_EVERY_SECS = 10.0
_MAX_SHOWN = 4  # step outputs shown with show_outputs


class ProgressBarHook(Hook):
    """Shows training progress: a tqdm bar when tqdm is importable, else an INFO line such as
    ``step 300/1000 (30%), 12.5 steps/sec, eta 0:00:56, loss = 0.53``.

    The bar advances every step (tqdm itself limits redraws to 10 per second); the ``fetches``
    are read, and the log line written, only on the schedule (every ``every_n_secs`` = 10 s by
    default, or every ``every_n_steps``). The total is ``total_steps``, else the last step of a
    `StopAtStepHook` in the same session, else unknown (the bar then counts without an ETA).

    Args:
        total_steps: the global step training ends at.
        every_n_steps: refresh the postfix / log every this many steps.
        every_n_secs: ... or every this many seconds (the default, 10 s, when neither is given).
        fetches: output keys to show next to the progress, e.g. ``["loss"]``.
        show_outputs: show the step's scalar outputs (the first four, e.g. the loss) without
            naming them in ``fetches`` (what the front doors' default bar shows).
        desc: the bar's label.
        use_tqdm: True to require tqdm, False for log lines, None to use tqdm if installed.
        tqdm_kwargs: extra arguments for ``tqdm`` (e.g. ``file``, ``ncols``, ``leave``).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, total_steps: int | None = None, *, every_n_steps: int | None = None,
                 every_n_secs: float | None = None, fetches: Any = (), desc: str = "train",
                 use_tqdm: bool | None = None, tqdm_kwargs: dict | None = None, clock: Clock | None = None,
                 show_outputs: bool = False) -> None:
        self._total = check_int("total_steps", total_steps, minimum=1, allow_none=True)
        if every_n_steps is None and every_n_secs is None:
            every_n_secs = _DEFAULT_EVERY_SECS
        every_steps, every_secs = check_schedule("ProgressBarHook", ("every_n_steps", every_n_steps),
                                                 ("every_n_secs", every_n_secs))
        self._clock = resolve_clock(clock)
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=self._clock)
        self._fetches = _check_keys(fetches)
        self._show_outputs = check_bool("show_outputs", show_outputs)
        if not isinstance(desc, str):
            raise TypeError(f"desc must be a string, got {desc!r}")
        self._desc = desc
        self._use_tqdm = _resolve_tqdm(use_tqdm)
        if tqdm_kwargs is not None and not isinstance(tqdm_kwargs, dict):
            raise TypeError(f"tqdm_kwargs must be a dict of tqdm arguments or None, got {tqdm_kwargs!r}")
        self._tqdm_kwargs = dict(tqdm_kwargs or {})
        self._run_args = RunArgs(fetches={key: key for key in self._fetches}) if self._fetches else None
        self._bar: Any = None
        self._started = False
        self._trigger = False

    @property
    def uses_tqdm(self) -> bool:
        return self._use_tqdm

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.reset()
        self._started = False  # the bar opens (or re-syncs) at the next step, after every hook's creation

    def before_run(self, run_context: RunContext) -> RunArgs | None:
        self._trigger = self._timer.should_trigger_for_step(run_context.session.global_step + 1)
        return self._run_args if self._trigger else None

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if not self._started:
            self._start(run_context.session)
        if self._bar is not None:
            self._bar.update(1)
        if self._trigger:
            results = run_values.results
            if self._show_outputs:
                shown = list(scalars_of(getattr(run_context.session, "last_output", None)).items())
                results = {**dict(shown[:_MAX_SHOWN]), **(results or {})}
            self._report(run_context.session.global_step, results)

    def end(self, session: Any) -> None:
        self._close()

    def on_exception(self, session: Any, exc: BaseException) -> None:
        self._close()

    def _start(self, session: Any) -> None:
        self._started = True
        if self._total is None:
            self._total = next((h.last_step for h in session.hooks
                                if isinstance(h, StopAtStepHook) and h.last_step is not None), None)
        first = session.global_step - 1  # the step this run started from
        if self._use_tqdm:
            if self._bar is None:
                self._bar = _tqdm(total=self._total, initial=first, desc=self._desc, unit="step", **self._tqdm_kwargs)
            else:  # re-created after a recoverable error: the step may have gone back
                self._bar.n = first
                self._bar.refresh()

    def _report(self, step: int, results: Any) -> None:
        elapsed_secs, elapsed_steps = self._timer.update_last_triggered_step(step)
        values = {key: scalar_or_none(value) for key, value in (results or {}).items()}
        shown = ", ".join(f"{k} = {v:.4g}" if v is not None else f"{k} = {results[k]}" for k, v in values.items())
        if self._bar is not None:
            if values:
                self._bar.set_postfix_str(shown, refresh=False)
            return
        total = f"/{self._total} ({100.0 * step / self._total:.0f}%)" if self._total else ""
        parts = [f"step {step}{total}"]
        if elapsed_secs:
            rate = elapsed_steps / elapsed_secs
            parts.append(f"{rate:.3g} steps/sec")
            if self._total and rate > 0:
                parts.append(f"eta {datetime.timedelta(seconds=round(max(0, self._total - step) / rate))}")
        if shown:
            parts.append(shown)
        logger.info("%s: %s", self._desc, ", ".join(parts))

    def _close(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()


def _resolve_tqdm(use_tqdm: bool | None) -> bool:
    if use_tqdm is None:
        return _tqdm is not None
    if not isinstance(use_tqdm, bool):
        raise TypeError(f"use_tqdm must be True, False or None (use tqdm if installed), got {use_tqdm!r}")
    if use_tqdm and _tqdm is None:
        raise ValueError("use_tqdm=True but tqdm is not installed; pip install tqdm "
                         "(or torch-supervisor[progress]), or pass use_tqdm=None to fall back to log lines")
    return use_tqdm


def _check_keys(fetches: Any) -> list[str]:
    return list(check_named_fetches("fetches", fetches, keys_only=True))
