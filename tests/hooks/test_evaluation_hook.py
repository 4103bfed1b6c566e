"""`EvaluationHook` (issue 34 item 1): evaluation inside the training loop on the live model —
on schedule and at the end, as eval events TensorBoard and the early-stopping hooks read,
without disturbing training (RNG, modes: bit-exact), and after a real SIGKILL no evaluation
lost or doubled."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import supervisor
from hooks import EvaluationHook, StopAtStepHook, read_eval_metrics, stop_if_no_decrease_hook
from supervisor import MonitoredTrainingSession
from tests import zygote
from tests.killing import kill_after_checkpoint, trainer_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
    val = [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]
    return model, opt, val


def _eval_step(model, batch):
    return {"loss": torch.nn.functional.mse_loss(model(batch[0]), batch[1])}


def _train(logdir, hooks, last_step, model, opt):
    with MonitoredTrainingSession(str(logdir), model=model, optimizer=opt, save_summaries_steps=None,
                                  log_step_count_steps=None, hooks=[*hooks, StopAtStepHook(last_step=last_step)]) as s:
        while not s.should_stop():
            def step():
                x = torch.randn(8, 4)  # draws from the global RNG: an evaluation must not shift it
                loss = model(x).pow(2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
                return {"loss": loss}
            s.run(step)
    return s


def _events(directory):
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("loss")]


def test_evaluates_on_schedule_and_at_the_end_into_eval_events(tmp_path):
    model, opt, val = _setup()
    hook = EvaluationHook(val, _eval_step, every_n_steps=5)
    expected = {}

    class Spy(supervisor.Hook):  # the model as the hook saw it: evaluated by hand at the same steps
        def after_run(self, run_context, run_values):
            step = run_context.session.global_step
            if step % 5 == 0 or step == 17:
                with torch.no_grad():
                    was = model.training
                    model.eval()
                    expected[step] = sum(float(_eval_step(model, b)["loss"]) for b in val) / len(val)
                    model.train(was)

    _train(tmp_path, [Spy(), hook], 17, model, opt)
    steps = [step for step, _ in _events(tmp_path / "eval")]
    assert steps == [5, 10, 15, 17]
    assert dict(_events(tmp_path / "eval")) == pytest.approx(expected, rel=1e-6)
    assert {step: m["loss"] for step, m in read_eval_metrics(str(tmp_path / "eval")).items()} == pytest.approx(expected)
    assert hook.last_metrics["global_step"] == 17


def test_a_run_that_evaluates_ends_bit_identical_to_one_that_does_not_and_modes_are_kept(tmp_path):
    model, opt, val = _setup()
    model[1].eval()  # a module the user keeps in eval mode stays so; the others stay in train mode
    shuffled = lambda: torch.utils.data.DataLoader(val * 2, batch_size=None, shuffle=True)  # noqa: E731 - draws RNG
    torch.manual_seed(3)
    _train(tmp_path / "a", [EvaluationHook(shuffled, _eval_step, every_n_steps=3)], 12, model, opt)
    rng_after = torch.get_rng_state()
    assert model.training and not model[1].training and model[2].training
    reference, ref_opt, _ = _setup()
    reference[1].eval()
    torch.manual_seed(3)
    _train(tmp_path / "b", [], 12, reference, ref_opt)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    assert torch.equal(rng_after, torch.get_rng_state())  # the training stream drew exactly the same


def test_the_early_stopping_hooks_read_its_evaluations(tmp_path):
    model, opt, val = _setup()
    constant = lambda m, b: {"loss": torch.tensor(1.0)}  # noqa: E731 - never decreases
    s = _train(tmp_path, [EvaluationHook(val, constant, every_n_steps=2),
                          stop_if_no_decrease_hook(str(tmp_path / "eval"), "loss", 4, run_every_secs=None,
                                                   run_every_steps=2)], 100, model, opt)
    assert s.global_step < 20  # stopped early: no decrease for 4 steps of evaluations


@pytest.mark.parametrize("kwargs, error, match", [
    ({"data": iter([1])}, TypeError, "is an iterator"),
    ({"data": 5}, TypeError, "must be a re-iterable"),
    ({"data": [1], "every_n_steps": 5, "every_n_secs": 5}, ValueError, "exactly one of every_n_steps"),
    ({"data": [1], "steps": 0}, ValueError, "steps must be a positive int"),
    ({"data": [1], "eval_step": 3}, TypeError, "eval_step must be"),
    ({"data": [1], "name": "a/b"}, ValueError, "name must be a plain"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        EvaluationHook(**kwargs)


def test_a_state_without_a_model_is_named(tmp_path):
    with pytest.raises(ValueError, match="no 'model' module"):
        with MonitoredTrainingSession(str(tmp_path), state={"opt": torch.optim.SGD([torch.zeros(1, requires_grad=True)],
                                                                                   lr=1)},
                                      hooks=[EvaluationHook([1])]):
            pass


_TRAINER = """
import sys, torch
from hooks import EvaluationHook, StopAtStepHook
from supervisor import MonitoredTrainingSession
from tests.killing import kill_after_checkpoint, trainer_env
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
val = [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(2)]
ev = EvaluationHook(val, lambda m, b: {"loss": torch.nn.functional.mse_loss(m(b[0]), b[1])}, every_n_steps=5)
with MonitoredTrainingSession(sys.argv[1], model=model, optimizer=opt, save_checkpoint_steps=10,
                              save_summaries_steps=None, hooks=[ev, StopAtStepHook(last_step=int(sys.argv[2]))]) as s:
    while not s.should_stop():
        def step():
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            return {"loss": loss}
        s.run(step)
"""


@pytest.mark.slow
def test_after_a_kill_no_evaluation_is_lost_or_doubled(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAINER)
    env = trainer_env()
    reference = zygote.python([script, tmp_path / "ref", "40"], env=env, timeout=120)
    assert reference.returncode == 0, reference.stderr
    logdir = str(tmp_path / "run")
    killed_at = kill_after_checkpoint([str(script), logdir, str(10**9)], logdir, past_step=19, env=env)
    assert killed_at < 40, "the run finished before the kill; nothing was tested"
    rerun = zygote.python([script, logdir, "40"], env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    shown = _events(os.path.join(logdir, "eval"))
    assert [step for step, _ in shown] == [5, 10, 15, 20, 25, 30, 35, 40]  # none lost, none twice
    assert shown == _events(tmp_path / "ref" / "eval")  # the values of a run never killed
