"""Early stopping on evaluation metrics (TF's ``tf.estimator.experimental.stop_if_*`` hooks).

The evaluator (`Estimator.evaluate`, `SidecarEvaluator`) writes its metrics as TensorBoard
events under an eval directory (``model_dir/eval``), at the step of the checkpoint it
evaluated. These hooks re-read that directory every ``run_every_secs`` (or steps) and stop
training when the metrics say so.

Example: stop once accuracy exceeds 0.9, or once the loss has not improved for 5,000 steps::

    hooks = [stop_if_higher_hook("run/eval", "accuracy", 0.9),
             stop_if_no_decrease_hook("run/eval", "loss", max_steps_without_decrease=5_000)]
"""
from __future__ import annotations

import logging
import numbers
import operator
import os
from typing import Any, Callable

from supervisor.clock import Clock
from supervisor.events import read_scalars
from supervisor.hook import Hook, RunContext, RunValues
from supervisor.toolkit import check_callable, check_int, check_path, check_schedule

from hooks.timer import SecondOrStepTimer

__all__ = [
    "EarlyStoppingHook",
    "make_early_stopping_hook",
    "read_eval_metrics",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]

logger = logging.getLogger(__name__)


class EarlyStoppingHook(Hook):
    """Requests a stop when ``should_stop_fn()`` returns True, asking it every N secs or steps.

    Only the chief asks: in a distributed run the session's stop agreement carries the chief's
    decision to every rank, so all of them stop at the same step (SPEC §12). The predicate is
    first asked after the first step.

    Args:
        should_stop_fn: ``should_stop_fn() -> bool``.
        run_every_secs: ask every this many seconds (None to ask by steps).
        run_every_steps: ask every this many steps.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, should_stop_fn: Callable[[], bool], *, run_every_secs: float | None = 60,
                 run_every_steps: int | None = None, clock: Clock | None = None) -> None:
        self._should_stop_fn = check_callable("should_stop_fn", should_stop_fn, allow_none=False,
                                              signature="should_stop_fn() -> bool")
        every_steps, every_secs = check_schedule("early stopping", ("run_every_steps", run_every_steps),
                                                 ("run_every_secs", run_every_secs))
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=clock)
        self._is_chief = True

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._is_chief = bool(getattr(session, "is_chief", True))

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        step = run_context.session.global_step
        if not self._timer.should_trigger_for_step(step):
            return
        self._timer.update_last_triggered_step(step)
        if self.decide(step):
            logger.info("requesting early stopping at global step %d", step)
            run_context.request_stop()

    def decide(self, step: int) -> bool:
        """The stop decision at ``step``: the predicate's answer on the chief, False elsewhere.
        This is the one place a distributed run shares the decision from."""
        return self._is_chief and bool(self._should_stop_fn())


def make_early_stopping_hook(estimator_or_eval_dir: Any, should_stop_fn: Callable[[], bool],
                             run_every_secs: float | None = 60, run_every_steps: int | None = None, *,
                             clock: Clock | None = None) -> EarlyStoppingHook:
    """A hook that stops training when ``should_stop_fn()`` returns True (TF's).

    Args:
        estimator_or_eval_dir: the estimator or eval directory the predicate reads (kept for
            TF's signature; the predicate is what decides).
        should_stop_fn: ``should_stop_fn() -> bool``.
        run_every_secs: ask every this many seconds; pass None with ``run_every_steps``.
        run_every_steps: ask every this many steps.
        clock: injectable clock.
    """
    if estimator_or_eval_dir is not None:
        _eval_dir_of(estimator_or_eval_dir, None)  # validates the argument
    return EarlyStoppingHook(should_stop_fn, run_every_secs=run_every_secs,
                             run_every_steps=run_every_steps, clock=clock)


def stop_if_higher_hook(estimator_or_eval_dir: Any, metric_name: str, threshold: float, eval_dir: str | None = None,
                        min_steps: int = 0, run_every_secs: float | None = 60, run_every_steps: int | None = None, *,
                        clock: Clock | None = None) -> EarlyStoppingHook:
    """Stops once ``metric_name`` is higher than ``threshold`` at an eval step >= ``min_steps``."""
    return _threshold_hook(estimator_or_eval_dir, metric_name, threshold, operator.gt, "greater than",
                           eval_dir, min_steps, run_every_secs, run_every_steps, clock)


def stop_if_lower_hook(estimator_or_eval_dir: Any, metric_name: str, threshold: float, eval_dir: str | None = None,
                       min_steps: int = 0, run_every_secs: float | None = 60, run_every_steps: int | None = None, *,
                       clock: Clock | None = None) -> EarlyStoppingHook:
    """Stops once ``metric_name`` is lower than ``threshold`` at an eval step >= ``min_steps``."""
    return _threshold_hook(estimator_or_eval_dir, metric_name, threshold, operator.lt, "less than",
                           eval_dir, min_steps, run_every_secs, run_every_steps, clock)


def stop_if_no_increase_hook(estimator_or_eval_dir: Any, metric_name: str, max_steps_without_increase: int,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = 60,
                             run_every_steps: int | None = None, *, clock: Clock | None = None) -> EarlyStoppingHook:
    """Stops once ``metric_name`` has not increased for ``max_steps_without_increase`` steps of
    evaluations (counting evals at steps >= ``min_steps``)."""
    check_int("max_steps_without_increase", max_steps_without_increase, minimum=1)
    return _no_improvement_hook(estimator_or_eval_dir, metric_name, max_steps_without_increase, operator.gt,
                                "increase", eval_dir, min_steps, run_every_secs, run_every_steps, clock)


def stop_if_no_decrease_hook(estimator_or_eval_dir: Any, metric_name: str, max_steps_without_decrease: int,
                             eval_dir: str | None = None, min_steps: int = 0, run_every_secs: float | None = 60,
                             run_every_steps: int | None = None, *, clock: Clock | None = None) -> EarlyStoppingHook:
    """Stops once ``metric_name`` has not decreased for ``max_steps_without_decrease`` steps of
    evaluations (counting evals at steps >= ``min_steps``)."""
    check_int("max_steps_without_decrease", max_steps_without_decrease, minimum=1)
    return _no_improvement_hook(estimator_or_eval_dir, metric_name, max_steps_without_decrease, operator.lt,
                                "decrease", eval_dir, min_steps, run_every_secs, run_every_steps, clock)


def _threshold_hook(source: Any, metric_name: str, threshold: float, is_better: Callable, words: str,
                    eval_dir: str | None, min_steps: int, run_every_secs: Any, run_every_steps: Any,
                    clock: Clock | None) -> EarlyStoppingHook:
    directory = _eval_dir_of(source, eval_dir)
    _check_metric(metric_name, min_steps)
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"threshold must be a number, got {threshold!r}")

    def threshold_crossed() -> bool:
        for step, metrics in read_eval_metrics(directory).items():
            if step < min_steps:
                continue
            value = _metric(metrics, metric_name, step, directory)
            if is_better(value, threshold):
                logger.info('at step %d, metric "%s" has value %s which is %s the configured threshold (%s) '
                            "for early stopping", step, metric_name, value, words, threshold)
                return True
        return False

    return EarlyStoppingHook(threshold_crossed, run_every_secs=run_every_secs, run_every_steps=run_every_steps,
                             clock=clock)


def _no_improvement_hook(source: Any, metric_name: str, max_steps: int, is_better: Callable, words: str,
                         eval_dir: str | None, min_steps: int, run_every_secs: Any, run_every_steps: Any,
                         clock: Clock | None) -> EarlyStoppingHook:
    directory = _eval_dir_of(source, eval_dir)
    _check_metric(metric_name, min_steps)

    def no_improvement() -> bool:
        best_value = best_step = None
        for step, metrics in read_eval_metrics(directory).items():
            if step < min_steps:
                continue
            value = _metric(metrics, metric_name, step, directory)
            if best_value is None or is_better(value, best_value):
                best_value, best_step = value, step
            if step - best_step >= max_steps:
                logger.info('no %s in metric "%s" for %d steps, which is greater than or equal to max steps '
                            "(%d) configured for early stopping", words, metric_name, step - best_step, max_steps)
                return True
        return False

    return EarlyStoppingHook(no_improvement, run_every_secs=run_every_secs, run_every_steps=run_every_steps,
                             clock=clock)


def read_eval_metrics(eval_dir: str) -> dict[int, dict[str, float]]:
    """Reads the scalar summaries of every events file in ``eval_dir`` as ``{step: {tag: value}}``,
    sorted by step (later events win for the same step and tag). A missing directory reads as
    no evaluations. The project's one reader, `supervisor.events.read_scalars`: regular files
    only (a FIFO named like an events file is skipped with a WARNING, never waited on), each up
    to its first torn record."""
    return read_scalars(eval_dir)


def _metric(metrics: dict[str, float], name: str, step: int, directory: str) -> float:
    try:
        return metrics[name]
    except KeyError:
        raise KeyError(f'early stopping reads metric "{name}", but the evaluation at step {step} in {directory} '
                       f"has only {sorted(metrics)}; pass one of those as metric_name") from None


def _check_metric(metric_name: Any, min_steps: Any) -> None:
    if not isinstance(metric_name, str) or not metric_name:
        raise TypeError(f"metric_name must be the non-empty tag of an eval metric such as 'loss', got {metric_name!r}")
    check_int("min_steps", min_steps, minimum=0)


def _eval_dir_of(source: Any, eval_dir: str | os.PathLike | None) -> str:
    """TF: ``eval_dir or estimator.eval_dir()``; a path given for the estimator is the eval dir."""
    if eval_dir is not None:
        return check_path("eval_dir", eval_dir, allow_none=True)
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    if callable(getattr(source, "eval_dir", None)):
        return os.fspath(source.eval_dir())
    raise TypeError(f"estimator_or_eval_dir must be the evaluator's event directory (e.g. 'model_dir/eval') or "
                    f"an estimator with eval_dir(), got {source!r}")
