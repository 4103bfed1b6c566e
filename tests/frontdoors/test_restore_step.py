"""Restoring a chosen step (issue 34 item 3): ``CheckpointManager.restore(state, step=...)`` and
the front doors' ``restore_step=`` (a step, or a checkpoint path of the logdir), verified like
every restore; a step that is not there is an error naming the steps available; a chosen
checkpoint that fails verification is an error, never a fallback to another step."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from supervisor import CheckpointManager, MonitoredTrainingSession, Supervisor, TrainingState
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError

pytestmark = pytest.mark.timeout(120)
STEPS = (100, 200, 300)


def _model():
    torch.manual_seed(0)
    return nn.Linear(4, 2)


def _logdir(path) -> dict[int, torch.Tensor]:
    """Commits steps 100, 200, 300 with different weights; returns each step's weight."""
    model = _model()
    saved = {}
    manager = CheckpointManager(str(path), max_to_keep=None, save_mode="sync")
    manager.open()
    try:
        for step in STEPS:
            with torch.no_grad():
                model.weight.add_(1.0)
            manager.save(step, TrainingState.from_arguments(model=model))
            saved[step] = model.weight.detach().clone()
    finally:
        manager.close()
    return saved


def _restore(path, step):
    model = _model()
    manager = CheckpointManager(str(path), save_mode="sync")
    manager.open()
    try:
        restored = manager.restore(TrainingState.from_arguments(model=model), step=step)
    finally:
        manager.close()
    return restored, model


def test_the_manager_restores_a_chosen_step_or_path(tmp_path):
    saved = _logdir(tmp_path)
    restored, model = _restore(tmp_path, 200)
    assert restored.global_step == 200 and torch.equal(model.weight, saved[200])
    restored, model = _restore(tmp_path, str(tmp_path / "model.ckpt-100"))
    assert restored.global_step == 100 and torch.equal(model.weight, saved[100])
    restored, model = _restore(tmp_path, None)  # the newest, as before
    assert restored.global_step == 300 and torch.equal(model.weight, saved[300])


def test_a_missing_step_names_the_steps_available(tmp_path):
    _logdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError, match=r"step 150.*100, 200, 300"):
        _restore(tmp_path, 150)
    with pytest.raises(CheckpointNotFoundError, match=r"no checkpoint yet"):
        _restore(tmp_path / "empty", 100)


def test_a_chosen_checkpoint_that_fails_verification_is_an_error_not_a_fallback(tmp_path):
    _logdir(tmp_path)
    state_file = tmp_path / "model.ckpt-200" / "state.pt"
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    state_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"model.ckpt-200.*100, 300"):
        _restore(tmp_path, 200)


@pytest.mark.parametrize("door", ["Supervisor", "MonitoredTrainingSession"])
def test_the_front_doors_restore_the_chosen_step_once(door, tmp_path):
    saved = _logdir(tmp_path)
    model = _model()
    if door == "Supervisor":
        sv = Supervisor(str(tmp_path), model, restore_step=200, save_model_secs=0, save_summaries_secs=0,
                        handle_signals=False)
        with sv.managed_session() as session:
            assert session.global_step == 200 and torch.equal(model.weight, saved[200])
        with sv.managed_session() as session:  # a second session restores the newest, not the choice again
            assert session.global_step == 300
    else:
        with MonitoredTrainingSession(str(tmp_path), model, restore_step=str(tmp_path / "model.ckpt-200"),
                                      save_checkpoint_secs=None, save_summaries_steps=None, log_step_count_steps=None,
                                      handle_signals=False) as session:
            assert session.global_step == 200 and torch.equal(model.weight, saved[200])


@pytest.mark.parametrize(("value", "error", "needle"), [
    (-1, ValueError, "restore_step"),
    (True, TypeError, "restore_step"),
    (2.5, ValueError, "restore_step"),
    ("elsewhere/model.ckpt-100", ValueError, "not a checkpoint of the logdir"),
])
def test_a_bad_restore_step_is_refused_at_construction(value, error, needle, tmp_path):
    with pytest.raises(error, match=needle):
        Supervisor(str(tmp_path / "run"), _model(), restore_step=value)
    assert not os.path.exists(tmp_path / "run")


def test_a_restore_step_without_a_logdir_is_refused():
    with pytest.raises(ValueError, match=r"restore_step=100 .*without a logdir"):
        Supervisor(None, _model(), restore_step=100)
