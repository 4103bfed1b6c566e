"""Loop variables as state (issue 34 item 4): plain values — an epoch, a best loss, a learning
rate, a carried LSTM hidden state — checkpointed as they are through `supervisor.LoopState`,
loaded under ``weights_only``, restored by every front door and after a real SIGKILL."""
from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

import supervisor
from hooks import StopAtStepHook
from supervisor import LoopState, MonitoredTrainingSession, Supervisor, TrainingState
from tests import zygote
from tests.killing import kill_after_checkpoint, trainer_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_attribute_and_item_access_and_the_values_a_checkpoint_can_hold():
    loop = LoopState(epoch=0, best=float("inf"), name="run", hidden=(torch.zeros(2), torch.ones(2)), hist=[1, 2.5],
                     extra={"a": None, "b": True})
    loop.epoch += 1
    loop["best"] = 0.5
    assert (loop.epoch, loop["best"], "hidden" in loop, len(loop)) == (1, 0.5, True, 6)
    assert list(loop) == ["epoch", "best", "name", "hidden", "hist", "extra"]
    with pytest.raises(AttributeError, match="has no variable 'epochs'.*'epoch'"):
        loop.epochs


@pytest.mark.parametrize("value, where", [
    (object(), "LoopState.bad is a builtins.object"),
    ([1, {2: 3}], r"LoopState.bad\[1\] has the key 2"),
    ({"sched": torch.optim.lr_scheduler}, r"LoopState.bad\['sched'\] is a builtins.module"),
    (torch.nn.Linear(1, 1), "LoopState.bad is a torch.nn.modules.linear.Linear.*own entry"),
])
def test_a_value_no_weights_only_checkpoint_can_hold_is_refused_when_set(value, where):
    with pytest.raises(TypeError, match=where):
        LoopState(bad=value)
    loop = LoopState()
    with pytest.raises(TypeError, match=where):
        loop.bad = value
    assert "bad" not in loop


@pytest.mark.parametrize("name", ["_private", "state_dict", "load_state_dict"])
def test_names_that_would_shadow_the_protocol_are_refused(name):
    with pytest.raises(AttributeError, match="rename it"):
        LoopState(**{name: 1})


@pytest.mark.parametrize("value", [5, 0.1, "x", [1, 2], {"epoch": 5}, torch.zeros(1)])
def test_a_plain_value_as_a_state_entry_is_refused_pointing_at_loop_state(value):
    with pytest.raises(TypeError, match=r"plain value .*supervisor.LoopState.*state=\{'loop': LoopState\(epoch="):
        TrainingState.from_arguments(state={"epoch": value})


def test_a_variable_added_after_the_checkpoint_keeps_its_initial_value_with_a_warning(caplog):
    loop = LoopState(epoch=0, patience=3)
    with caplog.at_level(logging.WARNING, logger="supervisor.state.loop_state"):
        loop.load_state_dict({"epoch": 7, "old": "kept too"})
    assert (loop.epoch, loop.patience, loop.old) == (7, 3, "kept too")
    assert "no value for patience" in caplog.text


def _model_and_loop():
    torch.manual_seed(0)
    model = torch.nn.LSTM(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return model, opt, LoopState(epoch=0, lr=1.0, best_loss=float("inf"), note="", hidden=None)


def _train(s, model, opt, loop):
    while not s.should_stop():
        def step():
            out, hidden = model(torch.ones(2, 1, 4), loop.hidden)
            loss = out.pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            loop.hidden = tuple(h.detach() for h in hidden)   # carried across steps, like the LSTM example
            loop.best_loss = min(loop.best_loss, float(loss.detach()))
            loop.epoch += 1
            loop.note = f"step {loop.epoch}"
            return {"loss": loss}
        s.run(step)


@pytest.mark.parametrize("front_door", ["Supervisor", "MonitoredTrainingSession"])
def test_every_front_door_restores_the_loop_variables_bit_exactly(tmp_path, front_door):
    def session(model, opt, loop, last_step):
        if front_door == "Supervisor":
            return Supervisor(str(tmp_path), model=model, optimizer=opt, state={"loop": loop}, save_summaries_secs=0,
                              hooks=[StopAtStepHook(last_step=last_step)]).managed_session()
        return MonitoredTrainingSession(str(tmp_path), model=model, optimizer=opt, state={"loop": loop},
                                        hooks=[StopAtStepHook(last_step=last_step)], save_summaries_steps=None)

    model, opt, loop = _model_and_loop()
    with session(model, opt, loop, 5) as s:
        _train(s, model, opt, loop)
    saved = LoopState(**loop.as_dict())
    model2, opt2, loop2 = _model_and_loop()
    with session(model2, opt2, loop2, 5) as s:
        assert s.global_step == 5
    assert loop2 == saved and loop2.epoch == 5 and loop2.note == "step 5" and loop2.best_loss < float("inf")
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(loop2.hidden, saved.hidden))
    raw = torch.load(os.path.join(supervisor.latest_checkpoint(str(tmp_path)), "state.pt"), weights_only=True)
    assert raw["loop"]["epoch"] == 5 and torch.equal(raw["loop"]["hidden"][0], saved.hidden[0])


_TRAINER = """
import sys, torch
from hooks import StopAtStepHook
from supervisor import LoopState, MonitoredTrainingSession
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loop = LoopState(epoch=0, total=0.0, hidden=torch.zeros(3))
with MonitoredTrainingSession(sys.argv[1], model=model, optimizer=opt, state={"loop": loop}, save_checkpoint_steps=3,
                              save_summaries_steps=None, hooks=[StopAtStepHook(last_step=int(sys.argv[2]))]) as s:
    print("restored", s.global_step, loop.epoch, loop.total, loop.hidden.tolist(), flush=True)
    while not s.should_stop():
        def step():
            loss = model(loop.hidden).pow(2).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            loop.epoch += 1
            loop.total += 0.5
            loop.hidden = loop.hidden + 1
            return {"loss": loss}
        s.run(step)
"""


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_with_the_loop_variables_of_that_step(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAINER)
    logdir, env = str(tmp_path / "run"), trainer_env()
    step = kill_after_checkpoint([str(script), logdir, str(10**9)], logdir, past_step=3, env=env)
    rerun = zygote.python([script, logdir, step], env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"restored {step} {step} {step * 0.5} {[float(step)] * 3}" in rerun.stdout, rerun.stdout
