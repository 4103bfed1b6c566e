"""TF's evaluation workflow on the runtime (SPEC §10): `Estimator`, `RunConfig`, `TrainSpec` /
`EvalSpec` / `train_and_evaluate`, the exporters and `Experiment`.

Example::

    from supervisor.estimator import Estimator, EvalSpec, RunConfig, TrainSpec, train_and_evaluate

    est = Estimator(model=net, optimizer=opt, train_step=train_step, eval_step=eval_step,
                    config=RunConfig("runs/exp", save_checkpoints_steps=500))
    metrics, exports = train_and_evaluate(est, TrainSpec(train_input_fn, max_steps=5_000),
                                          EvalSpec(eval_input_fn, steps=50, throttle_secs=0))
"""
from __future__ import annotations

from supervisor.estimator.estimator import Estimator
from supervisor.estimator.evaluation import EvaluationLoop
from supervisor.estimator.experiment import Experiment
from supervisor.estimator.exporters import BestExporter, Exporter, FinalExporter, LatestExporter
from supervisor.estimator.run_config import RunConfig, TaskType
from supervisor.estimator.sidecar import SidecarEvaluator
from supervisor.estimator.specs import EvalSpec, TrainSpec
from supervisor.estimator.training import train_and_evaluate
from supervisor.estimator.warm_start import WarmStartSettings

__all__ = [
    "BestExporter",
    "Estimator",
    "EvalSpec",
    "EvaluationLoop",
    "Experiment",
    "Exporter",
    "FinalExporter",
    "LatestExporter",
    "RunConfig",
    "SidecarEvaluator",
    "TaskType",
    "TrainSpec",
    "WarmStartSettings",
    "train_and_evaluate",
]
