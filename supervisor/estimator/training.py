"""`train_and_evaluate`: TF's train-then-evaluate-each-checkpoint workflow (SPEC §10.2).

What this process does depends on ``estimator.config.task_type``:

- ``None`` (local): train, with a `CheckpointSaverListener` that evaluates each committed
  checkpoint — never the one written at session creation, never sooner than
  ``eval_spec.throttle_secs`` after the previous evaluation started, and always the final one;
  the exporters run after each evaluation. Returns ``(metrics, export_results)`` of the last
  evaluation. The listener evaluates the checkpoint whose commit it was told about, loaded into
  a copy of the model; it never asks for a synchronous save.
- ``"chief"`` / ``"worker"``: train only (``train_spec.hooks`` and ``saving_listeners``).
- ``"evaluator"``: the continuous-evaluation loop (`supervisor.estimator.evaluation`): waits
  ``start_delay_secs``, evaluates each new checkpoint, throttled, and exits after evaluating a
  checkpoint at or beyond ``max_steps`` or the final checkpoint of a run the trainer marked
  finished.

After a kill (local mode), the eval events are the record of what was evaluated: a run that
starts from a checkpoint with no evaluation yet (committed while the killed process evaluated or
exported) evaluates and exports it before training; one evaluated before is offered only to the
exporters holding no export of its step (a kill during the exports). No step is evaluated or
exported twice: a rerun of a finished job evaluates and exports nothing and returns the recorded
metrics of the final checkpoint (``export_results`` None for each exporter).

Decisions where TF is silent or surprising: the final local evaluation counts as the final
export even when ``max_steps`` is None (training ended because the data did), and exporters that
did not export the final checkpoint when it was first evaluated are offered it again as final.
Workers start at once (TF delayed worker ``i`` by ``5 * (i + 1)`` seconds for asynchronous
parameter-server training; torch.distributed ranks step together, so a delay would only hold
every rank back); `Experiment` keeps TF's delays.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Iterable

from hooks.checkpoint import CheckpointSaverListener

from supervisor.checkpoint import CheckpointRead, checkpoint_name, read_checkpoint
from supervisor.errors import CheckpointNotFoundError
from supervisor.estimator.estimator import Estimator
from supervisor.estimator.evaluation import EvaluationLoop, StopReason
from supervisor.checkpoint.storage import Location
from supervisor.estimator.exporters import BestExporter, Exporter
from supervisor.estimator.locations import join
from supervisor.estimator.run_config import TaskType
from supervisor.estimator.sidecar import evaluated_steps
from supervisor.estimator.specs import EvalSpec, TrainSpec
from supervisor.events import read_scalars

__all__ = ["train_and_evaluate", "EvalResult", "Evaluator", "EvaluateAfterSaveListener", "exported_steps"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """One evaluation: its metrics (with ``global_step``), the checkpoint, the exports."""

    metrics: dict[str, Any]
    checkpoint_path: str
    export_results: tuple[Any, ...] = ()


class Evaluator:
    """Evaluates one checkpoint and runs the exporters (TF's ``_Evaluator``)."""

    def __init__(self, estimator: Estimator, eval_spec: EvalSpec, max_training_steps: int | None) -> None:
        self._estimator, self._spec, self._max_steps = estimator, eval_spec, max_training_steps
        self._exported: dict[str, str] = {}  # exporter name -> checkpoint it last exported
        self.is_final_export_triggered = False
        for exporter in eval_spec.exporters:
            if isinstance(exporter, BestExporter):
                exporter.set_default_eval_dir(estimator.eval_dir(eval_spec.name))

    def evaluate_and_export(self, checkpoint: str | CheckpointRead, *, final: bool = False) -> EvalResult:
        """Evaluates a checkpoint (a path, or one already read); it is the final export when
        ``final`` or its step reaches ``max_training_steps``."""
        spec = self._spec
        if not isinstance(checkpoint, CheckpointRead):
            checkpoint = read_checkpoint(checkpoint, storage=self._estimator.locate(checkpoint).storage)
        checkpoint_path = checkpoint.path
        metrics = self._estimator.evaluate_checkpoint(checkpoint, spec.input_fn, steps=spec.steps,
                                                      name=spec.name, hooks=spec.hooks)
        del checkpoint  # the payload can be large: exporters reuse the loaded evaluation copy
        final = final or bool(self._max_steps and metrics["global_step"] >= self._max_steps)
        return EvalResult(metrics, checkpoint_path, self._export(metrics, checkpoint_path, final, spec.exporters))

    def export_final(self, result: EvalResult) -> EvalResult:
        """Offers an already evaluated checkpoint as the final export to the exporters that did
        not export it."""
        pending = [e for e in self._spec.exporters if self._exported.get(e.name) != result.checkpoint_path]
        if self.is_final_export_triggered or not pending:
            return result
        return dataclasses.replace(result, export_results=self._export(
            result.metrics, result.checkpoint_path, True, pending))

    def export_pending(self, result: EvalResult, exporters: list[Any], *, final: bool) -> tuple:
        """Offers an evaluation made by an earlier run to ``exporters``; their results in order."""
        return self._export(result.metrics, result.checkpoint_path, final, exporters)

    def _export(self, metrics: dict[str, Any], checkpoint_path: str, final: bool, exporters: Any) -> tuple:
        results = []
        for exporter in exporters:
            path = exporter.export(self._estimator, join(self._estimator.model_dir, "export", exporter.name),
                                   checkpoint_path, metrics, final)
            if path is not None:
                self._exported[exporter.name] = checkpoint_path
            results.append(path)
        if final:
            self.is_final_export_triggered = True
        return tuple(results)


class EvaluateAfterSaveListener(CheckpointSaverListener):
    """Evaluates committed checkpoints during local training (TF's
    ``_NewCheckpointListenerForEvaluate``), throttled, skipping the creation save, and once
    more at the end if the final checkpoint was not evaluated. Once a signal stopped the run
    (preemption) it evaluates nothing more: the process should exit quickly, and the resumed run
    evaluates.

    Args:
        evaluator: the `Evaluator`.
        throttle_secs: minimum seconds between the starts of two evaluations.
        start_step: the global step training starts from; its checkpoint (the one written at
            session creation, or the one restored) is not evaluated when saved.
        clock: the clock throttling uses.
        every_steps: also wait for this many steps since the last evaluation (`Experiment`'s
            ``min_eval_frequency``).
        evaluated: steps already evaluated (their metrics are in the eval events): never again.
    """

    def __init__(self, evaluator: Evaluator, throttle_secs: float, start_step: int, clock: Any, *,
                 every_steps: int | None = None, evaluated: Iterable[int] = ()) -> None:
        self._evaluator, self._throttle_secs = evaluator, throttle_secs
        self._start_step, self._clock, self._every_steps = start_step, clock, every_steps
        self._evaluated = set(evaluated)
        self.result: EvalResult | None = None
        self._last_start: float | None = None
        self._last_step = start_step

    def begin(self) -> None:
        self._last_start = None

    def before_save(self, session: Any, global_step_value: int) -> None:
        # keep_best (RunConfig): the evaluation's metrics rank the checkpoints, never the step outputs.
        metrics = getattr(session.checkpoint_manager, "metrics", None)
        if metrics is not None:
            metrics.expect_evaluation()

    def after_save(self, session: Any, global_step_value: int) -> None:
        if global_step_value == self._start_step or global_step_value in self._evaluated:
            return  # the creation save (TF skipped it too), or a step evaluated before
        if getattr(session, "preempted", False):
            logger.info("not evaluating the checkpoint of step %d: the run was preempted", global_step_value)
            return
        now = self._clock.monotonic()
        if self._last_start is not None and now - self._last_start < self._throttle_secs:
            logger.info("Skip the current checkpoint eval due to throttle secs (%s secs).", self._throttle_secs)
            return
        if self._every_steps and global_step_value - self._last_step < self._every_steps:
            logger.info("Skip the current checkpoint eval: %d steps since the last one, min_eval_frequency=%d",
                        global_step_value - self._last_step, self._every_steps)
            return
        self._evaluate(session, global_step_value, final=False)

    def end(self, session: Any, global_step_value: int) -> None:
        if getattr(session, "preempted", False):
            # A signal stopped training: exit within the grace period; the resumed run evaluates.
            logger.info("not evaluating the final checkpoint of step %d: the run was preempted", global_step_value)
            return
        if global_step_value in self._evaluated and (
                self.result is None or self.result.metrics["global_step"] != global_step_value):
            return  # evaluated by an earlier run; `train_and_evaluate` catches its exports up
        if self.result is None or self.result.metrics["global_step"] != global_step_value:
            self._evaluate(session, global_step_value, final=True)
        elif not self._evaluator.is_final_export_triggered:
            self.result = self._evaluator.export_final(self.result)

    def _evaluate(self, session: Any, step: int, *, final: bool) -> None:
        manager = session.checkpoint_manager
        path = join(manager.directory, checkpoint_name(manager.basename, step))
        self.evaluate_path(path, step, final=final)
        if self.result is not None and self.result.metrics.get("global_step") == step \
                and hasattr(manager, "report_metrics"):
            manager.report_metrics(step, self.result.metrics)  # keep_best: recorded with the checkpoint

    def evaluate_path(self, path: str, step: int, *, final: bool) -> None:
        """Evaluates (and exports) the checkpoint of ``step`` at ``path`` now; it counts for the
        throttle. A checkpoint gone meanwhile (retention) is skipped with an INFO line."""
        self._last_start, self._last_step = self._clock.monotonic(), step
        try:
            self.result = self._evaluator.evaluate_and_export(path, final=final)
        except CheckpointNotFoundError:
            logger.info("not evaluating the checkpoint of step %d: it is gone (a later one replaced it)", step)
            return
        self._evaluated.add(step)


def train_and_evaluate(estimator: Estimator, train_spec: TrainSpec,
                       eval_spec: EvalSpec) -> tuple[dict[str, Any] | None, tuple[Any, ...] | None]:
    """Trains and evaluates ``estimator`` as its task type says (see the module docstring).

    Returns:
        ``(metrics, export_results)`` of the last evaluation in local mode; ``(None, None)``
        on a chief or worker; the evaluator returns its last evaluation's.
    """
    if not isinstance(estimator, Estimator):
        raise TypeError(f"`estimator` must have type `supervisor.estimator.Estimator`. Got: {type(estimator)}")
    if not isinstance(train_spec, TrainSpec):
        raise TypeError(f"`train_spec` must have type `supervisor.estimator.TrainSpec`. Got: {type(train_spec)}")
    if not isinstance(eval_spec, EvalSpec):
        raise TypeError(f"`eval_spec` must have type `supervisor.estimator.EvalSpec`. Got: {type(eval_spec)}")
    config = estimator.config
    if config.task_type == TaskType.EVALUATOR and config.task_id > 0:
        raise ValueError("For distributed training, there can only be one `evaluator` task (with task id 0). "
                         f"Given task id {config.task_id}")
    if config.task_type is None:
        logger.info("Running training and evaluation locally (non-distributed).")
        return _run_local(estimator, train_spec, eval_spec)
    if config.task_type == TaskType.EVALUATOR:
        return _run_evaluator(estimator, train_spec, eval_spec)
    logger.info("Running training as the %s (task %d)", config.task_type, config.task_id)
    estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps, hooks=train_spec.hooks,
                    saving_listeners=train_spec.saving_listeners)
    return None, None


def _run_local(estimator: Estimator, train_spec: TrainSpec,
               eval_spec: EvalSpec) -> tuple[dict[str, Any] | None, tuple[Any, ...] | None]:
    config = estimator.config
    logger.info("Start train and evaluate loop. The evaluate will happen after every checkpoint. Checkpoint "
                "frequency is determined based on RunConfig arguments: save_checkpoints_steps %s or "
                "save_checkpoints_secs %s.", config.save_checkpoints_steps, config.save_checkpoints_secs)
    evaluator = Evaluator(estimator, eval_spec, train_spec.max_steps)
    eval_dir = estimator.eval_dir(eval_spec.name)
    recorded = read_scalars(estimator.locate(eval_dir))  # what was evaluated
    start_path = estimator.latest_checkpoint()
    start_step = None if start_path is None else estimator.checkpoint_step(start_path)
    listener = EvaluateAfterSaveListener(evaluator, eval_spec.throttle_secs, start_step=start_step or 0,
                                         clock=estimator.clock, evaluated=recorded)
    caught_up = None
    if start_step:  # a restored checkpoint (step 0 is the untrained model)
        caught_up = _catch_up(estimator, evaluator, listener, eval_spec, start_path, start_step,
                              recorded.get(start_step), train_spec.max_steps)
    estimator.train(train_spec.input_fn, max_steps=train_spec.max_steps, hooks=train_spec.hooks,
                    saving_listeners=tuple(train_spec.saving_listeners) + (listener,))
    result = listener.result or caught_up
    return (None, None) if result is None else (result.metrics, result.export_results)


def _catch_up(estimator: Estimator, evaluator: Evaluator, listener: EvaluateAfterSaveListener,
              eval_spec: EvalSpec, path: str, step: int, metrics: dict[str, float] | None,
              max_steps: int | None) -> EvalResult | None:
    """What a killed run left undone on the checkpoint this run starts from: evaluates it when
    the eval events hold no evaluation of it (it was committed while the killed process evaluated
    or exported, or killed mid-evaluation); when they do, offers it to the exporters that hold no
    export of that step (a kill during the exports) with the recorded metrics. It is the final
    export when training is already complete. Never evaluates or exports a step twice."""
    final = max_steps is not None and step >= max_steps
    if metrics is None:
        logger.info("evaluating the checkpoint of step %d this run starts from: it has no evaluation yet", step)
        listener.evaluate_path(path, step, final=final)
        return listener.result
    result = EvalResult(dict(metrics, global_step=step), path)
    exports = estimator.config.location.child("export")
    pending = [e for e in eval_spec.exporters if step not in exported_steps(exports.child(e.name))]
    if not pending:
        logger.info("the checkpoint of step %d this run starts from was evaluated and exported before", step)
        return dataclasses.replace(result, export_results=tuple(None for _ in eval_spec.exporters))
    logger.info("offering the checkpoint of step %d (evaluated before) to %s, which hold no export of it",
                step, ", ".join(e.name for e in pending))
    exports = evaluator.export_pending(result, pending, final=final)
    by_name = dict(zip((e.name for e in pending), exports))
    return dataclasses.replace(result, export_results=tuple(by_name.get(e.name) for e in eval_spec.exporters))


def exported_steps(export_path: str | os.PathLike | Location) -> set[int]:
    """The checkpoint steps of the complete exports under ``export_path`` (a path or URL, or its
    resolved `Location`; from their ``eval_result.json``; a damaged record counts as no export,
    with a WARNING): `Exporter.exported_steps`."""
    return Exporter.exported_steps(export_path)


def _run_evaluator(estimator: Estimator, train_spec: TrainSpec,
                   eval_spec: EvalSpec) -> tuple[dict[str, Any] | None, tuple[Any, ...] | None]:
    """The evaluator task: the shared continuous-evaluation loop over ``model_dir``.

    Steps whose metrics are already in the eval directory's event files are not evaluated again
    (a restarted evaluator). When the loop ends because the trainer marked the run finished, the
    last evaluated checkpoint is the final one: exporters that did not export it get it as final.
    """
    evaluator = Evaluator(estimator, eval_spec, train_spec.max_steps)
    eval_dir = estimator.eval_dir(eval_spec.name)
    done_before = evaluated_steps(estimator.locate(eval_dir))
    loop = EvaluationLoop(estimator.config.location, evaluator.evaluate_and_export,
                          start_delay_secs=eval_spec.start_delay_secs, throttle_secs=eval_spec.throttle_secs,
                          max_steps=train_spec.max_steps, skip_step=done_before.__contains__,
                          clock=estimator.clock)
    logger.info("Running the evaluator over %s (max_steps=%s)", estimator.model_dir, train_spec.max_steps)
    last: EvalResult | None = None
    for outcome in loop:
        last = outcome.metrics
    if last is not None and loop.stop_reason == StopReason.FINISHED:
        last = evaluator.export_final(last)
    return (None, None) if last is None else (last.metrics, last.export_results)
