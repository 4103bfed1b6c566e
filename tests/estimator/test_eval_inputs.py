"""Bad inputs of the evaluation front doors refused early and named (issue 21), metrics whose
``compute()`` returns a dict (issue 22 item 6), and one meaning of ``keep_checkpoint_max=0``
(issue 22 item 21)."""
from __future__ import annotations

import os

import pytest
import torch

from supervisor import MonitoredTrainingSession, Supervisor
from supervisor.checkpoint import checkpoints_iterator
from supervisor.estimator import Estimator, EvalSpec, RunConfig, SidecarEvaluator, TrainSpec, train_and_evaluate
from supervisor.estimator.evaluation import EvaluationLoop
from tests.estimator.estimator_toy import batches, eval_scalars, make_estimator, make_model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def paths(tmp_path):
    file = tmp_path / "a_file.txt"
    file.write_text("not a directory")
    return {"file": str(file), "under_file": str(file / "run"), "root": tmp_path}


def trained(tmp_path):
    est = make_estimator(tmp_path / "run")
    est.train(lambda: batches(), max_steps=5)
    return est


BAD_INPUTS = [
    # (id, call(paths) -> raises, exception, words the message must hold)
    ("runconfig-model-dir-file", lambda p: RunConfig(p["file"]), ValueError, ["model_dir", "a_file.txt"]),
    ("runconfig-model-dir-under-file", lambda p: RunConfig(p["under_file"]), ValueError,
     ["model_dir", "a_file.txt", "is a file"]),
    ("estimator-model-dir-file", lambda p: Estimator(p["file"], model=make_model()),
     ValueError, ["model_dir", "a_file.txt"]),
    ("estimator-model-dir-under-file",
     lambda p: Estimator(p["under_file"], model=make_model()),
     ValueError, ["model_dir", "a_file.txt"]),
    ("sidecar-log-dir-file",
     lambda p: SidecarEvaluator(make_model(), [1], str(p["root"]), log_dir=p["file"]),
     ValueError, ["log_dir", "a_file.txt"]),
    ("sidecar-checkpoint-dir-file", lambda p: SidecarEvaluator(make_model(), [1], p["file"]),
     ValueError, ["checkpoint_dir", "a_file.txt", "not a directory"]),
    ("evaluation-loop-checkpoint-dir-file", lambda p: EvaluationLoop(p["file"], lambda c: {}),
     ValueError, ["checkpoint_dir", "a_file.txt"]),
    ("checkpoints-iterator-file", lambda p: checkpoints_iterator(p["file"], timeout=0.01),
     ValueError, ["checkpoint_dir", "a_file.txt"]),
    ("train-input-fn-none", lambda p: make_estimator(p["root"] / "r").train(lambda: None, max_steps=2),
     TypeError, ["input_fn", "None", "iterable of batches"]),
    ("evaluate-input-fn-none", lambda p: trained(p["root"]).evaluate(lambda: None),
     TypeError, ["input_fn", "None", "iterable of batches"]),
    ("predict-input-fn-none", lambda p: list(trained(p["root"]).predict(lambda: None)),
     TypeError, ["input_fn", "None", "iterable of batches"]),
    ("keep-checkpoint-max-zero", lambda p: RunConfig(str(p["root"]), keep_checkpoint_max=0), ValueError,
     ["keep_checkpoint_max", "0", "None"]),
    ("sv-max-to-keep-zero", lambda p: Supervisor(logdir=str(p["root"]), model=make_model(), max_to_keep=0),
     ValueError, ["max_to_keep", "0", "None"]),
    ("mts-max-to-keep-zero",
     lambda p: MonitoredTrainingSession(str(p["root"]), make_model(), max_to_keep=0), ValueError,
     ["max_to_keep", "0", "None"]),
]


@pytest.mark.parametrize("call, exception, words", [row[1:] for row in BAD_INPUTS],
                         ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_refused_at_once_naming_it(paths, call, exception, words):
    with pytest.raises(exception) as info:
        call(paths)
    message = str(info.value)
    missing = [w for w in words if w not in message]
    assert not missing, f"message lacks {missing}: {message}"


class DictMetric:
    """A metric whose compute() returns a dict (Keras' DictMetric, torchmetrics' MetricCollection)."""

    def reset(self):
        self.sq, self.abs, self.n = 0.0, 0.0, 0

    def update(self, outputs, batch):
        x, y = batch
        self.sq += float(((x[:, 0] - y.float()) ** 2).sum())
        self.abs += float((x[:, 0] - y.float()).abs().sum())
        self.n += len(y)

    def compute(self):
        return {"mse": torch.tensor(self.sq / self.n), "mae": self.abs / self.n,
                "nested": {"n": self.n}}


def test_dict_metric_is_flattened_in_evaluate(tmp_path):
    est = make_estimator(tmp_path, metrics={"errors": DictMetric()})
    est.train(lambda: batches(), max_steps=5)
    metrics = est.evaluate(lambda: batches())
    assert {"errors/mse", "errors/mae", "errors/nested/n"} <= set(metrics)
    assert metrics["errors/nested/n"] == 96.0
    assert {"errors/mse", "errors/mae"} <= set(eval_scalars(est.eval_dir()))


def test_dict_metric_is_flattened_in_train_and_evaluate_and_sidecar(tmp_path):
    est = make_estimator(tmp_path, metrics={"errors": DictMetric()})
    metrics, _ = train_and_evaluate(est, TrainSpec(lambda: batches(), max_steps=5),
                                    EvalSpec(lambda: batches(), steps=None, throttle_secs=0))
    assert isinstance(metrics["errors/mse"], float)
    sidecar = SidecarEvaluator(make_model(), list(batches()), os.fspath(tmp_path), name="side",
                               eval_step=est._eval_step, metrics={"errors": DictMetric()}, max_evaluations=1)
    (result,) = sidecar.start()
    assert result.metrics["errors/mse"] == pytest.approx(metrics["errors/mse"])
    assert "errors/mae" in eval_scalars(sidecar.log_dir)


def test_dict_metric_with_a_non_number_names_the_key(tmp_path):
    class Bad(DictMetric):
        def compute(self):
            return {"mse": "high"}

    est = make_estimator(tmp_path, metrics={"errors": Bad()})
    est.train(lambda: batches(), max_steps=5)
    with pytest.raises(TypeError, match="errors/mse"):
        est.evaluate(lambda: batches())


def test_keep_checkpoint_max_none_keeps_every_checkpoint(tmp_path):
    config = RunConfig(os.fspath(tmp_path), save_checkpoints_steps=1, keep_checkpoint_max=None,
                       log_step_count_steps=0, save_summary_steps=0)
    est = make_estimator(tmp_path, config=config)
    est.train(lambda: batches(), max_steps=6)
    assert len([n for n in os.listdir(tmp_path) if n.startswith("model.ckpt-")]) == 7  # 0..6
