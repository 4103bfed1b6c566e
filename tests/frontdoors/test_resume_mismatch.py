"""Resuming into a training state that does not match the checkpoint fails at the restore,
naming what differs and what to do (issue 22 items 17 and 18)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import supervisor
from supervisor import CheckpointError, MonitoredTrainingSession, Supervisor, TrainingState


def _train_once(logdir, optimizer_cls, **kwargs):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = optimizer_cls(model.parameters(), lr=0.1, **kwargs)
    with Supervisor(logdir, model=model, optimizer=opt, save_summaries_secs=0,
                    handle_signals=False).managed_session() as s:
        def step():
            opt.zero_grad()
            model(torch.ones(4, 2)).pow(2).mean().backward()
            opt.step()
        s.run(step)
    return model


def test_resuming_with_another_optimizer_class_names_both_and_the_fix(tmp_path):
    _train_once(tmp_path, torch.optim.Adam)
    model = nn.Linear(2, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(CheckpointError) as info:
        MonitoredTrainingSession(tmp_path, model=model, optimizer=sgd, handle_signals=False)
    message = str(info.value)
    assert "'optimizer'" in message and "Adam" in message and "SGD" in message
    assert "restore_partial" in message and "new logdir" in message


def test_an_optimizer_state_without_its_class_is_checked_by_its_hyperparameters():
    """Checkpoints written before the class was recorded: the param_groups tell."""
    adam = torch.optim.Adam(nn.Linear(2, 1).parameters(), lr=0.1)
    state = TrainingState({"optimizer": torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)})
    with pytest.raises(CheckpointError, match=r"SGD.*'momentum'.*restore_partial"):
        state.load_state_dict({"optimizer": adam.state_dict()})


def test_the_same_optimizer_class_resumes(tmp_path):
    trained = _train_once(tmp_path, torch.optim.Adam)
    model = nn.Linear(2, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with MonitoredTrainingSession(tmp_path, model=model, optimizer=opt, handle_signals=False) as s:
        assert s.global_step == 1
    assert torch.equal(model.weight, trained.weight)


def test_resuming_without_the_optimizer_says_what_to_do_not_strict_false(tmp_path):
    _train_once(tmp_path, torch.optim.SGD)
    with pytest.raises(CheckpointError) as info:
        with Supervisor(tmp_path, model=nn.Linear(2, 1), handle_signals=False).managed_session():
            pass
    message = str(info.value)
    assert "unexpected entries ['optimizer']" in message
    assert "optimizer=" in message and "restore_partial" in message and "new logdir" in message
    assert "load with strict=False" not in message


class Phase:
    """A user's custom class, put inside a state_dict."""

    def __init__(self, name: str) -> None:
        self.name = name


class Schedule:
    def __init__(self) -> None:
        self.phase = Phase("warmup")

    def state_dict(self):
        return {"phase": self.phase, "weights": torch.zeros(3)}

    def load_state_dict(self, sd):
        self.phase = sd["phase"]


def test_a_custom_class_in_a_state_dict_fails_the_first_save_not_the_next_resume(tmp_path):
    """Issue 22.19: the save that writes what weights_only cannot load fails, naming the class
    and trusted_globals; nothing is committed."""
    model = nn.Linear(2, 1)
    with pytest.raises(CheckpointError) as info:
        with Supervisor(tmp_path, model=model, state={"schedule": Schedule()}, save_summaries_secs=0,
                        handle_signals=False).managed_session() as s:
            s.run(lambda: None)
    message = str(info.value)
    assert f"{__name__}.Phase" in message and "'schedule'" in message
    assert "trusted_globals=[" in message and "would not load" in message
    assert supervisor.latest_checkpoint(str(tmp_path)) is None


def test_a_trusted_custom_class_saves_and_resumes(tmp_path):
    for _ in range(2):
        schedule = Schedule()
        with Supervisor(tmp_path, model=nn.Linear(2, 1), state={"schedule": schedule}, save_summaries_secs=0,
                        handle_signals=False, trusted_globals=[Phase]).managed_session() as s:
            s.run(lambda: None)
            schedule.phase = Phase(f"after step {s.global_step}")
    assert schedule.phase.name == "after step 2" and s.global_step == 2
