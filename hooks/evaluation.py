"""`EvaluationHook`: evaluation inside the training loop, on the live model (TF's
``InMemoryEvaluatorHook``; Keras' and Lightning's validation every N steps).

Every ``every_n_steps`` or ``every_n_secs``, and at a clean end, the hook runs the evaluation
data through the model in eval mode under ``torch.no_grad()`` and writes the metrics — the means
of the scalars ``eval_step`` returns, plus ``metrics={name: obj}`` objects with
``update(outputs, batch)``/``compute()``/``reset()`` — as one event at the training step into
``<logdir>/eval`` (or ``eval_<name>``), the same eval events `Estimator.evaluate` writes:
TensorBoard shows them beside training, and the early-stopping hooks (``stop_if_no_decrease_hook
(logdir + "/eval", ...)``) read them.

Training is not disturbed: every RNG of the process is restored afterwards (a shuffled
evaluation loader or dropout left on cannot shift the training stream), every module's
``train()``/``eval()`` mode is put back as it was, and gradients are never touched — a run that
evaluates ends bit-identical to one that does not, and resumes bit-exactly.

After a kill: an evaluation at step N is written before step N's checkpoint is captured (the
hook runs in ``after_run``, before the step boundary), so a resume from checkpoint N never lacks
it. Evaluations the killed run made after its last checkpoint are superseded: the resumed
session writes a ``SessionLog.START`` at the restored step + 1 into the eval directory (as the
training curves get), so TensorBoard drops them, and the resumed run evaluates those steps again
(readers that take the later event per step — `read_eval_metrics`, the early-stopping hooks —
see the new values).

Keeping the best checkpoints: with ``keep_best``/``best_metric`` on the front door, each evaluation
reports its metrics to the session's checkpoint manager (a named hook's as ``<name>/<metric>``)
and asks for a checkpoint at that step, so every evaluated model is ranked by its own metric
(`supervisor.checkpoint.layout.best`); the end evaluation, after the final save, is recorded with it.

Decisions: evaluation runs on the chief only (it writes the events), on the module inside a
DDP or ``torch.compile`` wrapper, so no rank waits on a collective; a model with sharded
(DTensor / FSDP2) parameters is refused at the session's start — evaluate those with the sidecar
evaluator, which assembles whole tensors. An evaluation that raises fails the session.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable, Mapping

import torch

from supervisor.clock import resolve_clock
from supervisor.events import EvalEventsFile, read_scalars
from supervisor.hook import Hook, IdleUntil, RunContext, RunValues
from supervisor.metrics import MeanAggregator, check_metric_objects, flatten_metric
from supervisor.state.rng import capture_rng_state, restore_rng_state
from supervisor.state import unwrap_module
from supervisor.toolkit import check_schedule

from hooks._exports import LoopExporters, LoopExportTarget, check_exporters, model_key
from hooks.timer import SecondOrStepTimer

__all__ = ["EvaluationHook"]

logger = logging.getLogger(__name__)


class EvaluationHook(Hook):
    """Evaluates the live model every N steps or seconds and at the end (see the module).

    Args:
        data: the evaluation batches: a re-iterable (a list, a ``DataLoader``) or a zero-argument
            callable returning an iterable (called for each evaluation).
        eval_step: ``eval_step(model, batch) -> {name: scalar}``; default ``model(batch)`` (a
            scalar result is ``loss``).
        every_n_steps / every_n_secs: the schedule (exactly one; default every 1,000 steps).
        at_end: evaluate at a clean end too (unless the last step was just evaluated).
        steps: evaluate at most this many batches (None: all of ``data``).
        metrics: ``{name: obj}`` metric objects (update/compute/reset).
        model: the module to evaluate; default the session's ``state["model"]``.
        name: write to ``eval_<name>`` instead of ``eval`` (several evaluation sets).
        exporters: exporters of `supervisor.estimator` (`BestExporter`, `LatestExporter`,
            `FinalExporter`) called after each evaluation as ``train_and_evaluate`` calls them,
            exporting the model just evaluated into ``<logdir>/export/<name>`` (`hooks._exports`);
            the `FinalExporter` exports at the end (with ``at_end``). A local logdir only.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).

    Example::

        hooks=[EvaluationHook(val_loader, lambda m, b: {"loss": F.cross_entropy(m(b[0]), b[1])},
                              every_n_steps=500),
               stop_if_no_decrease_hook("runs/exp/eval", "loss", 2000, run_every_steps=500,
                                        run_every_secs=None)]

    Attributes:
        last_metrics: the metrics of the last evaluation (with ``global_step``), or None.
    """

    def __init__(self, data: Any, eval_step: Callable[[torch.nn.Module, Any], Any] | None = None, *,
                 every_n_steps: int | None = None, every_n_secs: float | None = None, at_end: bool = True,
                 steps: int | None = None, metrics: Mapping[str, Any] | None = None,
                 model: torch.nn.Module | None = None, name: str | None = None, exporters: Any = None,
                 clock: Any = None) -> None:
        if every_n_steps is None and every_n_secs is None:
            every_n_steps = 1000
        every_steps, every_secs = check_schedule("EvaluationHook", ("every_n_steps", every_n_steps),
                                                 ("every_n_secs", every_n_secs))
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=clock)
        self._every_steps = every_steps
        self._data = _check_data(data)
        if eval_step is not None and not callable(eval_step):
            raise TypeError(f"EvaluationHook's eval_step must be eval_step(model, batch) -> dict, got {eval_step!r}")
        self._eval_step = eval_step
        self._at_end = bool(at_end)
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise ValueError(f"EvaluationHook's steps must be a positive int or None, got {steps!r}")
        self._steps = steps
        self._metrics = check_metric_objects(metrics)
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"EvaluationHook's model must be a torch.nn.Module or None, got {model!r}")
        if name is not None and (not isinstance(name, str) or not name or os.sep in name or "/" in name):
            raise ValueError(f"EvaluationHook's name must be a plain non-empty name, got {name!r}")
        self._model_arg, self._name = model, name
        self._exporter_list = check_exporters(exporters)
        self._exporters: LoopExporters | None = None
        self._clock = resolve_clock(clock)
        self._model: torch.nn.Module | None = None
        self._events: EvalEventsFile | None = None
        self._last_evaluated: int | None = None
        self._keeper: Any = None  # the checkpoint manager ranking checkpoints by the metrics (keep_best)
        self.last_metrics: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the hook protocol
    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.reset()
        self._model = self._events = self._exporters = self._keeper = None
        if not getattr(session, "is_chief", True):
            return  # the chief evaluates and writes
        self._model = unwrap_module(self._resolve_model(session))
        _refuse_sharded(self._model)
        logdir = getattr(session, "logdir", None)
        if logdir is not None:
            directory = _join(logdir, "eval" if self._name is None else f"eval_{self._name}")
            manager = getattr(session, "checkpoint_manager", None)  # its client, on an object store
            self._keeper = _keeper_of(manager)
            self._events = EvalEventsFile(directory, storage=getattr(manager, "storage", None))
            if session.global_step > 0:  # a resume: what a killed run evaluated after step N is superseded
                self._events.write_start(session.global_step + 1)
                self._recall(directory, session.global_step)
            self._exporters = self._make_exporters(session, logdir, directory)
        elif self._exporter_list:
            raise ValueError("EvaluationHook's exporters write into <logdir>/export: give the session a logdir")
        # the schedule of a run never restarted: every multiple of every_n_steps, whatever step it resumed at
        self._timer.update_last_triggered_step(session.global_step - session.global_step % (self._every_steps or 1))

    def _recall(self, directory: str, step: int) -> None:
        """The evaluation of the restored step, when a run evaluated it before (then the end does
        not evaluate it twice, and the exporters that missed it get it from the record)."""
        if "://" in directory:
            return
        recorded = read_scalars(directory).get(step)
        if recorded is not None:
            self._last_evaluated, self.last_metrics = step, {**recorded, "global_step": step}

    def _make_exporters(self, session: Any, logdir: str, eval_dir: str) -> LoopExporters | None:
        if not self._exporter_list:
            return None
        if "://" in logdir:
            raise ValueError(f"EvaluationHook's exporters write into a local logdir only, got {logdir!r}; on an "
                             "object store export with train_and_evaluate or Estimator.export")
        manager = getattr(session, "checkpoint_manager", None)
        target = LoopExportTarget(logdir, eval_dir, self._model, model_key(session.state, self._model),
                                  getattr(manager, "basename", "model.ckpt"), self._clock)
        return LoopExporters(self._exporter_list, target)

    def idle_until(self) -> IdleUntil | None:
        return self._timer.idle_until()

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        step = run_context.session.global_step
        if self._model is not None and self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            self.evaluate(step)
            if self._exporters is not None:
                self._exporters.export(self.last_metrics, step, final=False)
            if self._keeper is not None and self._keeper.last_saved_step != step:
                run_context.session.request_save(f"evaluation at step {step} (keep_best)")

    def end(self, session: Any) -> None:
        if self._model is None:
            return
        step = session.global_step
        if self._at_end and self._last_evaluated != step:
            self.evaluate(step)
            if self._exporters is not None:
                self._exporters.export(self.last_metrics, step, final=True)
        elif self._exporters is not None and self._last_evaluated == step and self.last_metrics is not None:
            # the last step was evaluated already: offered as final to those holding no export of it
            self._exporters.export(self.last_metrics, step, final=True, only_pending=True)

    # ------------------------------------------------------------------ the evaluation
    def evaluate(self, step: int) -> dict[str, Any]:
        """Evaluates the model now and writes the metrics at ``step``; returns them."""
        assert self._model is not None, "EvaluationHook.evaluate runs inside a session (on the chief)"
        rng = capture_rng_state()  # every RNG of the process, restored whatever the evaluation drew
        try:
            with _modes_kept(self._model), torch.no_grad():
                self._model.eval()
                results = self._run_batches(self._model)
        finally:
            restore_rng_state(rng, where="the state saved before an in-loop evaluation")
        if self._events is not None:
            self._events.write(results, step)
        self._last_evaluated = step
        self.last_metrics = {**results, "global_step": step}
        if self._keeper is not None:  # ranks the checkpoint of this step (saved now or already)
            prefix = "" if self._name is None else f"{self._name}/"
            self._keeper.report_metrics(step, {prefix + k: v for k, v in results.items()})
        logger.info("evaluation at step %d: %s", step, ", ".join(f"{k} = {v:.4g}" for k, v in results.items()))
        return self.last_metrics

    def _run_batches(self, model: torch.nn.Module) -> dict[str, float]:
        means = MeanAggregator()
        for metric in self._metrics.values():
            metric.reset()
        done = 0
        for batch in (self._data() if callable(self._data) else self._data):
            if self._steps is not None and done >= self._steps:
                break
            outputs = _outputs(model, batch, self._eval_step)
            means.add(outputs)
            for metric in self._metrics.values():
                metric.update(outputs, batch)
            done += 1
        if done == 0:
            raise ValueError("EvaluationHook: the evaluation data produced no batch")
        results = means.result()
        for name, metric in self._metrics.items():
            results.update(flatten_metric(name, metric.compute()))
        return results

    def _resolve_model(self, session: Any) -> torch.nn.Module:
        if self._model_arg is not None:
            return self._model_arg
        model = session.state.get("model") if hasattr(session.state, "get") else None
        if not isinstance(model, torch.nn.Module):
            raise ValueError("EvaluationHook has no model to evaluate: the session's state has no 'model' module "
                             f"(it has {sorted(session.state)}); pass EvaluationHook(..., model=your_model)")
        return model


def _keeper_of(manager: Any) -> Any:
    """The manager when it ranks checkpoints by a metric (``keep_best``), told that an evaluation
    reports them (step outputs are then ignored); else None."""
    metrics = getattr(manager, "metrics", None)
    if metrics is None or not getattr(metrics, "wanted", False):
        return None
    metrics.expect_evaluation()
    return manager


def _check_data(data: Any) -> Any:
    if callable(data) and not hasattr(data, "__iter__"):
        return data
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes)):
        raise TypeError(f"EvaluationHook's data must be a re-iterable (a list, a DataLoader) or a callable "
                        f"returning an iterable, got {data!r}")
    if iter(data) is data:
        raise TypeError("EvaluationHook's data is an iterator, which runs out after one evaluation; pass the "
                        "list or DataLoader itself, or a function returning a fresh iterator")
    return data


def _outputs(model: torch.nn.Module, batch: Any, eval_step: Any) -> Mapping[str, Any]:
    outputs = eval_step(model, batch) if eval_step is not None else model(batch)
    if isinstance(outputs, Mapping):
        return outputs
    return {"loss": outputs}


class _modes_kept:  # noqa: N801 - a context manager used like a function
    """Puts every module's ``training`` flag back as it was (a model in mixed modes stays mixed)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._modes = [(m, m.training) for m in model.modules()]

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        for module, training in self._modes:
            module.training = training


def _refuse_sharded(model: torch.nn.Module) -> None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without DTensor has no sharded parameters
        return
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("EvaluationHook evaluates on the chief alone and cannot evaluate a model with sharded "
                         "(DTensor / FSDP2) parameters; evaluate sharded checkpoints with the sidecar evaluator "
                         "(supervisor.estimator.sidecar.SidecarEvaluator)")


def _join(logdir: str, name: str) -> str:
    return logdir.rstrip("/") + "/" + name if "://" in logdir else os.path.join(logdir, name)
