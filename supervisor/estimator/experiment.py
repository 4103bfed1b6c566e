"""`Experiment`: ``tf.contrib.learn.Experiment`` as a thin façade over the estimator (SPEC §10.5).

For users migrating from it; new code should call `train_and_evaluate` directly. Each argument
keeps its documented meaning:

- ``train_steps``: train to this global step (None: forever, or until the data ends);
- ``eval_steps``: evaluate at most this many batches (None: until ``eval_input_fn`` ends);
- ``train_hooks`` / ``eval_hooks``: hooks for training / evaluation (TF's ``train_monitors``);
- ``eval_delay_secs``: `evaluate` and `continuous_eval` wait this long before starting;
- ``continuous_eval_throttle_secs``: `continuous_eval` starts evaluations at least this far apart;
- ``min_eval_frequency`` (`train_and_evaluate` only): evaluate a new checkpoint once at least
  this many steps passed since the last evaluation; 0: only after training; None: 1 (every
  new checkpoint);
- ``delay_workers_by_global_step``: a ``"worker"`` task waits for the chief's checkpoints to
  reach ``int(8000 * log1p(task_id))`` steps instead of sleeping ``min(60, 5 * task_id)``
  seconds before training (staggered start of asynchronous workers; it only shifts the start
  of synchronous DDP ranks);
- ``export_strategies``: `Exporter` instances (or one), run after the evaluations of
  `train_and_evaluate` and `continuous_train_and_eval` (and of `continuous_eval` with
  ``export=True``);
- ``train_steps_per_iteration`` (`continuous_train_and_eval` only): train this many steps between
  two evaluations (None: ``min(1000, max(1, train_steps // 10))``, or 1000 without
  ``train_steps``).

Evaluations write to ``model_dir/eval`` (TF's Experiment named them; one directory keeps the
early-stopping hooks' default working).
"""
from __future__ import annotations

import logging
import math
import sys
from typing import Any, Callable, Iterable

from hooks.basic import GlobalStepWaiterHook
from supervisor import _validate as v
from supervisor.estimator.estimator import Estimator
from supervisor.estimator.evaluation import EvaluationLoop
from supervisor.estimator.run_config import TaskType
from supervisor.estimator.specs import EvalSpec, validate_exporters, validate_hooks, validate_input_fn
from supervisor.estimator.training import EvalResult, EvaluateAfterSaveListener, Evaluator

__all__ = ["Experiment"]

logger = logging.getLogger(__name__)

_DEFAULT_STEPS_PER_ITERATION = 1000


class Experiment:
    """Trains and evaluates an `Estimator` the way ``tf.contrib.learn.Experiment`` did (see the
    module docstring for each argument)."""

    def __init__(self, estimator: Estimator, train_input_fn: Callable[[], Iterable[Any]],
                 eval_input_fn: Callable[[], Iterable[Any]], train_steps: int | None = None,
                 eval_steps: int | None = 100, train_hooks: Iterable[Any] = (), eval_hooks: Iterable[Any] = (),
                 eval_delay_secs: float = 120, continuous_eval_throttle_secs: float = 60,
                 min_eval_frequency: int | None = None, delay_workers_by_global_step: bool = False,
                 export_strategies: Any = (), train_steps_per_iteration: int | None = None) -> None:
        if not isinstance(estimator, Estimator):
            raise TypeError(f"`estimator` must have type `supervisor.estimator.Estimator`. Got: {type(estimator)}")
        validate_input_fn(train_input_fn)
        validate_input_fn(eval_input_fn)
        self.estimator = estimator
        self.train_input_fn, self.eval_input_fn = train_input_fn, eval_input_fn
        self.train_steps = v.check_int("train_steps", train_steps, minimum=1, allow_none=True)
        self.eval_steps = v.check_int("eval_steps", eval_steps, minimum=1, allow_none=True)
        self.train_hooks, self.eval_hooks = validate_hooks(train_hooks), validate_hooks(eval_hooks)
        self.eval_delay_secs = v.check_number("eval_delay_secs", eval_delay_secs, minimum=0)
        self.continuous_eval_throttle_secs = v.check_number(
            "continuous_eval_throttle_secs", continuous_eval_throttle_secs, minimum=0)
        self.min_eval_frequency = v.check_int("min_eval_frequency", min_eval_frequency, minimum=0, allow_none=True)
        self.delay_workers_by_global_step = v.check_bool("delay_workers_by_global_step",
                                                         delay_workers_by_global_step)
        self.export_strategies = validate_exporters(export_strategies)
        self.train_steps_per_iteration = v.check_int("train_steps_per_iteration", train_steps_per_iteration,
                                                     minimum=1, allow_none=True)

    # ------------------------------------------------------------------ the methods
    def train(self, delay_secs: float | None = None) -> Estimator:
        """Trains to ``train_steps``; a ``"worker"`` task first waits (see the module docs)."""
        config, hooks = self.estimator.config, list(self.train_hooks)
        if config.task_type == TaskType.WORKER:
            if self.delay_workers_by_global_step:
                hooks.append(GlobalStepWaiterHook(int(8000.0 * math.log1p(config.task_id)),
                                                  clock=self.estimator.clock,
                                                  storage_options=config.storage_options))
            else:
                delay = min(60, 5 * config.task_id) if delay_secs is None else delay_secs
                self._sleep(delay, "training")
        elif delay_secs:
            self._sleep(delay_secs, "training")
        return self.estimator.train(self.train_input_fn, max_steps=self.train_steps, hooks=hooks)

    def evaluate(self, delay_secs: float | None = None, name: str | None = None) -> dict[str, Any]:
        """Waits ``delay_secs`` (default ``eval_delay_secs``), then evaluates the latest checkpoint."""
        self._sleep(self.eval_delay_secs if delay_secs is None else delay_secs, "evaluating")
        return self.estimator.evaluate(self.eval_input_fn, steps=self.eval_steps, name=name, hooks=self.eval_hooks)

    def continuous_eval(self, delay_secs: float | None = None, throttle_delay_secs: float | None = None,
                        continuous_eval_predicate_fn: Callable[[Any], bool] | None = None,
                        export: bool = True, name: str | None = None) -> dict[str, Any] | None:
        """Evaluates each new checkpoint (the shared continuous-evaluation loop) until one at
        ``train_steps`` is evaluated, the trainer marks the run finished, or
        ``continuous_eval_predicate_fn(last_metrics_or_None)`` returns False; returns the last
        metrics."""
        predicate = v.check_callable("continuous_eval_predicate_fn", continuous_eval_predicate_fn,
                                     signature="continuous_eval_predicate_fn(eval_result) -> bool")
        evaluator = Evaluator(self.estimator, self._eval_spec(name, export), self.train_steps)
        loop = EvaluationLoop(
            self.estimator.model_dir, evaluator.evaluate_and_export,
            start_delay_secs=self.eval_delay_secs if delay_secs is None else delay_secs,
            throttle_secs=self.continuous_eval_throttle_secs if throttle_delay_secs is None else throttle_delay_secs,
            max_steps=self.train_steps, clock=self.estimator.clock)
        last: dict[str, Any] | None = None
        if predicate is not None and not predicate(None):
            return None
        for outcome in loop:
            last = outcome.metrics.metrics
            if predicate is not None and not predicate(last):
                logger.info("continuous_eval_predicate_fn returned False: ending continuous evaluation")
                break
        return last

    def train_and_evaluate(self) -> tuple[dict[str, Any] | None, tuple[Any, ...]]:
        """Trains to ``train_steps``, evaluating new checkpoints at least ``min_eval_frequency``
        steps apart during training, then evaluates (and exports) the final checkpoint."""
        estimator = self.estimator
        evaluator = Evaluator(estimator, self._eval_spec(None, True), self.train_steps)
        frequency = 1 if self.min_eval_frequency is None else self.min_eval_frequency
        start_step = estimator.checkpoint_step()
        # min_eval_frequency=0: no evaluation during training, only the final one (at the end)
        listener = EvaluateAfterSaveListener(evaluator, 0, start_step=start_step or 0, clock=estimator.clock,
                                             every_steps=frequency or sys.maxsize)
        estimator.train(self.train_input_fn, max_steps=self.train_steps, hooks=self.train_hooks,
                        saving_listeners=(listener,))
        result = listener.result
        if result is None and start_step is not None and estimator.checkpoint_step() == start_step:
            result = evaluator.evaluate_and_export(estimator.latest_checkpoint(), final=True)  # nothing trained
        return (None, ()) if result is None else (result.metrics, result.export_results)

    def continuous_train_and_eval(
            self, continuous_eval_predicate_fn: Callable[[Any], bool] | None = None,
    ) -> tuple[dict[str, Any] | None, tuple[Any, ...]]:
        """Alternates ``train_steps_per_iteration`` steps of training and one evaluation (with
        exports) until ``train_steps``, the end of the data, or
        ``continuous_eval_predicate_fn(last_metrics_or_None)`` returning False."""
        predicate = v.check_callable("continuous_eval_predicate_fn", continuous_eval_predicate_fn,
                                     signature="continuous_eval_predicate_fn(eval_result) -> bool")
        estimator = self.estimator
        evaluator = Evaluator(estimator, self._eval_spec(None, True), self.train_steps)
        per_iteration = self._steps_per_iteration()
        result: EvalResult | None = None
        while predicate is None or predicate(None if result is None else result.metrics):
            step = estimator.checkpoint_step() or 0
            if self.train_steps is not None and step >= self.train_steps:
                break
            target = step + per_iteration if self.train_steps is None else min(step + per_iteration,
                                                                                self.train_steps)
            estimator.train(self.train_input_fn, max_steps=target, hooks=self.train_hooks)
            reached = estimator.checkpoint_step() or 0
            result = evaluator.evaluate_and_export(estimator.latest_checkpoint(), final=reached < target)
            if reached < target:
                logger.info("training data ended at step %d before step %d: stopping", reached, target)
                break
        return (None, ()) if result is None else (result.metrics, result.export_results)

    # ------------------------------------------------------------------ helpers
    def _eval_spec(self, name: str | None, export: bool) -> EvalSpec:
        return EvalSpec(self.eval_input_fn, steps=self.eval_steps, name=name, hooks=self.eval_hooks,
                        exporters=self.export_strategies if export else (), start_delay_secs=0, throttle_secs=0)

    def _steps_per_iteration(self) -> int:
        if self.train_steps_per_iteration is not None:
            return self.train_steps_per_iteration
        if self.train_steps is None:
            return _DEFAULT_STEPS_PER_ITERATION
        return min(_DEFAULT_STEPS_PER_ITERATION, max(1, self.train_steps // 10))

    def _sleep(self, secs: float, what: str) -> None:
        if secs > 0:
            logger.info("Waiting %g secs before %s.", secs, what)
            self.estimator.clock.sleep(secs)
