"""Estimator: train (hook assembly, steps/max_steps, skip), evaluate on a copy, events, predict,
variables."""
from __future__ import annotations

import logging

import pytest
import torch

import hooks
from supervisor import CheckpointNotFoundError, Hook
from supervisor.estimator import Estimator, RunConfig
from tests.estimator.estimator_toy import X, batches, endless, eval_scalars, eval_step, make_estimator


class SeeHooks(Hook):
    def after_create_session(self, session, coord):
        self.classes = [type(h).__name__ for h in session.hooks]


def test_train_hook_assembly_and_max_steps(tmp_path):
    est = make_estimator(tmp_path, config=RunConfig(tmp_path, save_checkpoints_steps=5, log_step_count_steps=2))
    seen = SeeHooks()
    est.train(endless(), max_steps=12, hooks=[seen])
    assert est.checkpoint_step() == 12
    assert seen.classes[:2] == ["CheckpointSaverHook", "StepCounterHook"]
    assert seen.classes[-4:] == ["NanTensorHook", "LoggingTensorHook", "StopAtStepHook", "SeeHooks"]
    est.train(endless(), steps=3)
    assert est.checkpoint_step() == 15


def test_train_skips_when_max_steps_reached(tmp_path, caplog):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=5)
    before = list(est.model.parameters())[0].detach().clone()
    with caplog.at_level(logging.INFO, logger="supervisor.estimator.estimator"):
        est.train(endless(), max_steps=5)
    assert "Skipping training since max_steps=5 has already been reached" in caplog.text
    assert torch.equal(list(est.model.parameters())[0], before)


def test_train_argument_errors(tmp_path):
    est = make_estimator(tmp_path)
    with pytest.raises(ValueError, match="Can not provide both steps and max_steps"):
        est.train(endless(), steps=1, max_steps=2)
    with pytest.raises(ValueError, match="Must specify steps > 0, given: 0"):
        est.train(endless(), steps=0)
    with pytest.raises(TypeError, match="`input_fn` must be callable"):
        est.train([1, 2])
    no_schedule = make_estimator(tmp_path, config=RunConfig(tmp_path, save_checkpoints_secs=None))
    with pytest.raises(ValueError, match="There should be a CheckpointSaverHook to use saving_listeners"):
        no_schedule.train(endless(), steps=1, saving_listeners=[hooks.CheckpointSaverListener()])
    with pytest.raises(ValueError, match="needs train_step"):
        make_estimator(tmp_path, train_step=None).train(endless(), steps=1)


def test_constructor_errors(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        Estimator(tmp_path, model=object())
    with pytest.raises(ValueError, match="differ"):
        Estimator(tmp_path / "a", model=model, config=RunConfig(tmp_path / "b"))
    with pytest.raises(TypeError, match=r"metrics\['acc'\] must have update"):
        Estimator(tmp_path, model=model, metrics={"acc": object()})
    with pytest.raises(TypeError, match="example_input must be a tensor or a tuple"):
        Estimator(tmp_path, model=model, example_input=[1])
    with pytest.raises(ValueError, match="needs a model_dir"):
        Estimator(model=model)


def test_evaluate_uses_a_copy_in_eval_mode_under_no_grad(tmp_path):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=5)
    seen = []

    def checking_eval_step(model, batch):
        seen.append((model is est.model, model.training, torch.is_grad_enabled()))
        return eval_step(model, batch)

    est._eval_step = checking_eval_step
    live = {k: v.clone() for k, v in est.model.state_dict().items()}
    est.model.train()
    with torch.no_grad():  # move the live weights away from the checkpoint's
        for p in est.model.parameters():
            p.add_(1.0)
    rng = torch.get_rng_state()
    metrics = est.evaluate(lambda: batches(shuffle=True), steps=3)
    assert seen == [(False, False, False)] * 3
    assert est.model.training and torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, live[k] + 1.0) for k, v in est.model.state_dict().items())
    # the metrics are the checkpoint's, not the (moved) live model's
    assert metrics["global_step"] == 5
    assert metrics == pytest.approx(est.evaluate(lambda: batches(shuffle=True), steps=3))


def test_evaluate_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="Could not find trained model"):
        make_estimator(tmp_path).evaluate(lambda: batches())


class CountingAccuracy:
    """A torchmetrics-style metric object."""

    def __init__(self):
        self.calls = []
        self.reset()

    def reset(self):
        self.calls.append("reset")
        self.correct = self.total = 0

    def update(self, outputs, batch):
        self.calls.append("update")
        self.total += len(batch[1])
        self.correct += int(outputs["accuracy"] * len(batch[1]))

    def compute(self):
        self.calls.append("compute")
        return torch.tensor(self.correct / self.total)


def test_eval_metrics_means_objects_and_events(tmp_path):
    metric = CountingAccuracy()
    est = make_estimator(tmp_path, metrics={"exact_accuracy": metric})
    est.train(endless(), max_steps=5)
    first = est.evaluate(lambda: batches(batch_size=32), steps=2)
    assert metric.calls == ["reset", "reset", "update", "update", "compute"]
    # means over batches of the step outputs
    model = est.load_model_copy(est.latest_checkpoint())[0]
    with torch.no_grad():
        expected = [eval_step(model, b)["loss"].item() for b in list(batches(batch_size=32))[:2]]
    assert first["loss"] == pytest.approx(sum(expected) / 2)
    assert first["exact_accuracy"] == pytest.approx(first["accuracy"])
    est.train(endless(), max_steps=10)
    second = est.evaluate(lambda: batches(batch_size=32), steps=2)
    est.evaluate(lambda: batches(), name="holdout")
    scalars = eval_scalars(est.eval_dir())
    assert set(scalars) == {"loss", "accuracy", "exact_accuracy"}  # bare tags, no global_step tag
    assert scalars["loss"] == [(5, pytest.approx(first["loss"])), (10, pytest.approx(second["loss"]))]
    assert [s for s, _ in eval_scalars(str(tmp_path / "eval_holdout"))["loss"]] == [10]
    assert est.eval_dir("holdout") == str(tmp_path / "eval_holdout")


def test_predict_yields_one_output_per_example(tmp_path):
    est = make_estimator(tmp_path, predict_step=lambda m, b: {"logits": m(b[0]), "label": m(b[0]).argmax(1)})
    est.train(endless(), max_steps=5)
    outputs = list(est.predict(lambda: batches(batch_size=40)))
    assert len(outputs) == len(X)
    model = est.load_model_copy(est.latest_checkpoint())[0]
    with torch.no_grad():
        assert torch.allclose(outputs[41]["logits"], model(X[41:42])[0])
    plain = make_estimator(tmp_path)
    assert torch.allclose(next(plain.predict(lambda: (b[0] for b in batches()))), outputs[0]["logits"])


def test_variable_names_and_values_read_memory_mapped(tmp_path, monkeypatch):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=5)
    ckpt_model = est.load_model_copy(est.latest_checkpoint())[0]
    loads = []
    real_load = torch.load

    def spy(*args, **kwargs):
        loads.append((kwargs.get("mmap"), kwargs.get("weights_only")))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    names = est.get_variable_names()
    assert "global_step" in names and "model/0.weight" in names and "model/3.bias" in names
    assert not any(n.startswith(("rng", "__meta__")) for n in names)
    assert est.get_variable_value("global_step") == 5
    assert torch.equal(est.get_variable_value("model/0.weight"), ckpt_model[0].weight)
    assert loads and all(entry == (True, True) for entry in loads)
    with pytest.raises(KeyError, match="is not a variable"):
        est.get_variable_value("model/nope")
    with pytest.raises(KeyError, match="names a group of variables"):
        est.get_variable_value("model")


class StopAfterTwo(Hook):
    def after_create_session(self, session, coord):
        self.start = session.global_step
        self.model_is_copy = session.state["model"]

    def after_run(self, run_context, run_values):
        if run_context.session.global_step - self.start >= 2:
            run_context.request_stop()


def test_eval_hooks_see_the_checkpoint_step_and_can_end_the_evaluation(tmp_path):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=5)
    hook = StopAfterTwo()
    metrics = est.evaluate(lambda: batches(batch_size=16), hooks=[hook])
    assert hook.start == 5 and hook.model_is_copy is not est.model
    model = est.load_model_copy(est.latest_checkpoint())[0]
    with torch.no_grad():
        first_two = [eval_step(model, b)["loss"].item() for b in list(batches(batch_size=16))[:2]]
    assert metrics["loss"] == pytest.approx(sum(first_two) / 2)


def test_predict_leaves_the_rng_alone(tmp_path):
    est = make_estimator(tmp_path, predict_step=lambda m, b: m(b[0]))
    est.train(endless(), max_steps=5)
    rng = torch.get_rng_state()
    outputs = list(est.predict(lambda: batches(shuffle=True)))
    assert len(outputs) == len(X) and torch.equal(torch.get_rng_state(), rng)
