"""SidecarEvaluator (SPEC §10.4): metrics to TensorBoard, hooks, restart, never the trainer's files."""
from __future__ import annotations

import hashlib
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from supervisor import Hook
from supervisor.estimator.evaluation import StopReason
from supervisor.estimator.sidecar import SidecarEvaluator, evaluated_steps
from supervisor.errors import CheckpointError
from supervisor.testing import RecordingHook

from tests.estimator.sidecar_helpers import ScriptedClock, StepTrainer, make_model, weight_metrics, weight_of


@pytest.fixture
def trainer(tmp_path):
    t = StepTrainer(str(tmp_path / "run"), max_to_keep=2)
    yield t
    t.close()


BATCHES = [torch.ones(3, 8)] * 4


def sidecar(trainer, clock=None, **kwargs) -> SidecarEvaluator:
    kwargs.setdefault("eval_step", weight_metrics)
    kwargs.setdefault("timeout", 5)
    return SidecarEvaluator(make_model(), BATCHES, trainer.directory, clock=clock or ScriptedClock(), **kwargs)


def scalars(log_dir: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def trainer_files(directory: str) -> dict[str, str]:
    out = {}
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith("eval")]
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_metrics_go_to_eval_at_the_checkpoints_step_with_bare_tags(trainer):
    trainer.save(1)
    clock = ScriptedClock()
    clock.at(3, lambda: trainer.save(2))
    clock.at(6, lambda: trainer.save(3))
    ev = sidecar(trainer, clock, poll_secs=1)
    results = ev.start()
    assert [r.step for r in results] == [1, 2, 3]
    assert results[-1].metrics == {"w": pytest.approx(weight_of(3)), "spread": 0.0, "global_step": 3}
    events = scalars(os.path.join(trainer.directory, "eval"))
    assert set(events) == {"w", "spread"}
    assert [(s, pytest.approx(v, abs=1e-6)) for s, v in events["w"]] == [(s, weight_of(s)) for s in (1, 2, 3)]
    assert ev.stop_reason == StopReason.TIMEOUT


def test_name_and_log_dir_choose_the_directory(trainer, tmp_path):
    trainer.save(1)
    sidecar(trainer, name="holdout").start()
    assert [s for s, _ in scalars(os.path.join(trainer.directory, "eval_holdout"))["w"]] == [1]
    sidecar(trainer, log_dir=str(tmp_path / "elsewhere")).start()
    assert [s for s, _ in scalars(str(tmp_path / "elsewhere"))["w"]] == [1]


class Accuracy:
    """A torchmetrics-style metric object: reset / update / compute."""

    def __init__(self):
        self.calls = []
        self.reset()

    def reset(self):
        self.calls.append("reset")
        self.total = 0.0
        self.n = 0

    def update(self, outputs, batch):
        self.calls.append("update")
        self.total += float(outputs["w"]) * batch.shape[0]
        self.n += batch.shape[0]

    def compute(self):
        self.calls.append("compute")
        return torch.tensor(self.total / self.n)


def test_metric_objects_and_steps(trainer):
    trainer.save(1)
    acc = Accuracy()
    acc.calls.clear()
    results = sidecar(trainer, metrics={"acc": acc}, steps=2, max_evaluations=1).start()
    assert results[0].metrics["acc"] == pytest.approx(weight_of(1))
    assert acc.calls == ["reset", "update", "update", "compute"]  # steps=2 of 4 batches


class Probe(torch.nn.Sequential):
    """The trainer's model (same keys), recording its mode and grad state at every forward."""

    def __init__(self):
        super().__init__(*make_model())
        self.seen = []

    def forward(self, batch):
        self.seen.append((self.training, torch.is_grad_enabled()))
        return super().forward(batch).mean()


def test_model_runs_in_eval_mode_without_grad_and_model_batch_by_default(trainer):
    trainer.save(1)
    model = Probe()
    model.train()
    results = SidecarEvaluator(model, BATCHES, trainer.directory, clock=ScriptedClock(), timeout=1).start()
    assert model.seen and set(model.seen) == {(False, False)}
    assert set(results[0].metrics) == {"loss", "global_step"}  # a scalar from model(batch) is "loss"


def test_a_checkpoint_that_does_not_fit_the_model_is_a_clear_error(trainer):
    trainer.save(1)
    with pytest.raises(CheckpointError, match=r"model.ckpt-1 \(step 1\) does not fit the evaluator's model"):
        SidecarEvaluator(torch.nn.Linear(8, 8), BATCHES, trainer.directory, clock=ScriptedClock(), timeout=1).start()


def test_hooks_get_the_lifecycle_once_per_evaluation(trainer):
    trainer.save(4)
    recorder = RecordingHook()
    steps_seen = []

    class StepProbe(Hook):
        def after_create_session(self, session, coord):
            steps_seen.append(session.global_step)
            assert torch.equal(session.state["model"][0].bias, torch.full((8,), weight_of(4)))

    sidecar(trainer, hooks=[recorder, StepProbe()], steps=2).start()
    assert recorder.calls == ["begin", "after_create_session", "before_run", "after_run",
                              "before_run", "after_run", "end"]
    assert steps_seen == [4]


def test_a_hook_requesting_stop_ends_that_evaluation(trainer):
    trainer.save(1)

    class StopAfterOne(Hook):
        def after_run(self, run_context, run_values):
            run_context.request_stop()

    acc = Accuracy()
    sidecar(trainer, hooks=[StopAfterOne()], metrics={"acc": acc}).start()
    assert acc.calls.count("update") == 1


def test_a_restarted_evaluator_skips_steps_already_in_its_event_files(trainer):
    trainer.save(1)
    trainer.save(2)
    first = sidecar(trainer)
    assert [r.step for r in first.start()] == [2]
    log_dir = os.path.join(trainer.directory, "eval")
    assert evaluated_steps(log_dir) == {2}
    clock = ScriptedClock()
    clock.at(2, lambda: trainer.save(3))
    second = sidecar(trainer, clock)
    assert [r.step for r in second.start()] == [3]
    assert second.stats.skipped == 1
    assert sorted(s for s, _ in scalars(log_dir)["w"]) == [2, 3]  # each step once


def test_takes_no_lock_and_writes_nothing_into_the_trainers_files(trainer):
    """The trainer's manager holds the ownership lock the whole time: the evaluator never needs it."""
    trainer.save(1)
    before, listed = trainer_files(trainer.directory), set(os.listdir(trainer.directory))
    sidecar(trainer).start()
    assert trainer_files(trainer.directory) == before
    assert set(os.listdir(trainer.directory)) == listed | {"eval"}


def test_a_checkpoint_without_a_model_entry_is_a_clear_error(tmp_path):
    from supervisor import TrainingState
    from supervisor.checkpoint import CheckpointManager

    with CheckpointManager(str(tmp_path), save_mode="sync") as manager:
        manager.save(1, TrainingState({"net": make_model()}))
    with pytest.raises(CheckpointError, match=r"has no 'model' entry \(it has \['net'\]\)"):
        SidecarEvaluator(make_model(), BATCHES, str(tmp_path), clock=ScriptedClock(), timeout=1).start()


def test_data_may_be_a_function_returning_the_batches(trainer):
    trainer.save(1)
    calls = []

    def data():
        calls.append(1)
        return iter(BATCHES)

    ev = SidecarEvaluator(make_model(), data, trainer.directory, eval_step=weight_metrics,
                          clock=ScriptedClock(), timeout=1)
    clock_run = ev.start()
    assert [r.step for r in clock_run] == [1] and calls == [1]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"data": iter(BATCHES)}, TypeError, "data is an iterator"),
    ({"data": 3}, TypeError, "data must be an iterable of batches or a function"),
    ({"steps": 0}, ValueError, "steps must be a positive integer or None, got 0"),
    ({"max_evaluations": 0}, ValueError, "max_evaluations must be a positive integer or None, got 0"),
    ({"name": "a/b"}, ValueError, "name must be a non-empty string without"),
    ({"metrics": {"acc": object()}}, TypeError, "metrics\\['acc'\\] must have update"),
    ({"hooks": [RecordingHook]}, TypeError, "is the class RecordingHook, not an instance"),
    ({"model": "net"}, TypeError, "model must be a torch.nn.Module, got str"),
])
def test_bad_arguments_fail_at_construction(tmp_path, kwargs, error, match):
    args = {"model": make_model(), "data": BATCHES, **kwargs}
    with pytest.raises(error, match=match):
        SidecarEvaluator(args.pop("model"), args.pop("data"), str(tmp_path), **args)


def test_log_dir_may_not_be_the_trainers_directory(tmp_path):
    with pytest.raises(ValueError, match="log_dir must not be the trainer's checkpoint_dir"):
        SidecarEvaluator(make_model(), BATCHES, str(tmp_path), log_dir=str(tmp_path))


def test_the_default_eval_step_on_x_y_batches_names_eval_step():
    """Issue 22.20: model((x, y)) failed with a raw TypeError from linear()."""
    from supervisor.estimator.sidecar import evaluate_batches

    batches = [(torch.ones(4, 2), torch.zeros(4, 1))]
    with pytest.raises(TypeError, match=r"no eval_step was given.*model\(batch\).*eval_step=") as info:
        evaluate_batches(torch.nn.Linear(2, 1), batches)
    assert isinstance(info.value.__cause__, TypeError)  # linear()'s own error, chained
