"""`LoggingTensorHook`: step outputs as INFO log lines, ``loss = 0.53, step = 101 (1.234 sec)``."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from supervisor.clock import Clock
from supervisor.hook import Hook, RunArgs, RunContext, RunValues, check_named_fetches, resolve_fetches
from supervisor.toolkit import check_bool, check_callable, check_int, check_number

from hooks.timer import NeverTriggerTimer, SecondOrStepTimer

__all__ = ["LoggingTensorHook"]

logger = logging.getLogger(__name__)


class LoggingTensorHook(Hook):
    """Logs step outputs every N local iterations or N seconds, and/or at the end (TF semantics).

    Iterations are counted from `begin` in this process (not the global step): the first
    iteration logs, then every ``every_n_iter``-th. Each line reads ``tag = value, ...`` in
    the given order (sorted tags when ``tensors`` is a dict), followed by the seconds since
    the previous line, e.g. ``loss = 0.53, step = 101 (1.234 sec)``; the first line has no
    time. Values print as NumPy does (``0.53``, not ``tensor(0.5300)``).

    Example::

        LoggingTensorHook({"loss": "loss", "lr": lambda: opt.param_groups[0]["lr"]},
                          every_n_iter=100)

    Args:
        tensors: a list of output keys, or a dict ``{tag: key_or_zero_arg_callable}``.
        every_n_iter: log every this many iterations.
        every_n_secs: log every this many seconds (exactly one of the two, unless only
            ``at_end``).
        at_end: also log the last step's values at a clean end.
        formatter: ``formatter({tag: value}) -> str`` replaces the default line (values are
            the objects the step returned, e.g. tensors).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, tensors: Any, every_n_iter: int | None = None, every_n_secs: float | None = None, *,
                 at_end: bool = False, formatter: Callable[[dict[str, Any]], str] | None = None,
                 clock: Clock | None = None) -> None:
        check_bool("at_end", at_end)
        only_at_end = at_end and every_n_iter is None and every_n_secs is None
        if not only_at_end and (every_n_iter is None) == (every_n_secs is None):
            raise ValueError("LoggingTensorHook: give at_end=True and/or exactly one of every_n_iter and "
                             f"every_n_secs, got every_n_iter={every_n_iter!r}, every_n_secs={every_n_secs!r}, "
                             f"at_end={at_end!r}")
        check_int("every_n_iter", every_n_iter, minimum=1, allow_none=True)
        check_number("every_n_secs", every_n_secs, strictly_positive=True, allow_none=True)
        self._tensors, self._tag_order = _check_tensors(tensors)
        self._formatter = check_callable("formatter", formatter, signature="formatter({tag: value}) -> str")
        self._timer: SecondOrStepTimer | NeverTriggerTimer = (
            NeverTriggerTimer(clock=clock) if only_at_end
            else SecondOrStepTimer(every_secs=every_n_secs, every_steps=every_n_iter, clock=clock))
        self._at_end = at_end
        self._run_args = RunArgs(fetches=self._tensors)
        self._iter_count = 0
        self._should_trigger = False

    def begin(self) -> None:
        self._timer.reset()
        self._iter_count = 0

    def before_run(self, run_context: RunContext) -> RunArgs | None:
        self._should_trigger = self._timer.should_trigger_for_step(self._iter_count)
        return self._run_args if self._should_trigger else None

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if self._should_trigger:
            self._log(run_values.results)
        self._iter_count += 1

    def end(self, session: Any) -> None:
        if not self._at_end:
            return
        if self._iter_count == 0:
            logger.debug("LoggingTensorHook: no step ran; nothing to log at the end")
            return
        self._log(resolve_fetches(self._tensors, session.last_output, self))

    def _log(self, values: dict[str, Any]) -> None:
        elapsed_secs, _ = self._timer.update_last_triggered_step(self._iter_count)
        if self._formatter is not None:
            logger.info("%s", self._formatter(values))
            return
        with np.printoptions(suppress=True):
            line = ", ".join(f"{tag} = {_format(values[tag])}" for tag in self._tag_order)
        if elapsed_secs is None:
            logger.info("%s", line)
        else:
            logger.info("%s (%.3f sec)", line, elapsed_secs)


def _check_tensors(tensors: Any) -> tuple[dict[str, Any], list[str]]:
    mapping = check_named_fetches("tensors", tensors, wrap_string=False, empty=(
        "tensors is empty: there is nothing to log; name at least one output, e.g. ['loss']"))
    return mapping, sorted(mapping) if isinstance(tensors, Mapping) else list(mapping)


def _format(value: Any) -> str:
    # Tensors print as NumPy values (TF's output): 0.53, [1. 2.], not tensor(0.5300).
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        try:
            value = value.numpy()
        except TypeError:  # dtypes NumPy lacks (bfloat16...): print their float32 values
            value = value.float().numpy()
    return str(value)
