"""MonitoredTrainingSession / SingularMonitoredSession: TF's argument rules and hook order (§7)."""
from __future__ import annotations

import re

import pytest
import torch

import hooks
from supervisor import Hook, MonitoredTrainingSession, SingularMonitoredSession, Supervisor
from supervisor.testing import RecordingHook


def _model():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("service, secs, steps", [("checkpoint", 10, 100), ("summaries", 10, 100)])
def test_both_secs_and_steps_is_a_value_error(tmp_path, service, secs, steps):
    with pytest.raises(ValueError, match=f"give either save_{service}_secs or save_{service}_steps, not both"):
        MonitoredTrainingSession(tmp_path, *_model(), **{f"save_{service}_secs": secs, f"save_{service}_steps": steps})


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"save_checkpoint_secs": -1}, ValueError, "save_checkpoint_secs must be a non-negative number"),
        ({"save_checkpoint_steps": 1.5}, ValueError, "save_checkpoint_steps must be a non-negative integer"),
        ({"save_summaries_steps": "100"}, TypeError, "save_summaries_steps must be a non-negative integer"),
        ({"log_step_count_steps": -5}, ValueError, "log_step_count_steps must be a non-negative integer"),
        ({"max_to_keep": 0}, ValueError, "max_to_keep must be a positive integer or None, got 0"),
        ({"keep_checkpoint_every_n_hours": 0}, ValueError, "keep_checkpoint_every_n_hours must be a positive number"),
        ({"save_mode": "background"}, ValueError, "save_mode must be one of 'async', 'sync', got 'background'"),
        ({"max_wait_secs": -1}, ValueError, "max_wait_secs must be a non-negative number"),
        ({"hooks": [hooks.StopAtStepHook]}, TypeError, "hooks[0] is the class StopAtStepHook, not an instance"),
        ({"chief_only_hooks": [1]}, TypeError, "chief_only_hooks[0] must be a supervisor.Hook instance"),
        ({"is_chief": "yes"}, TypeError, "is_chief must be True or False"),
        ({"recoverable_exceptions": ["x"]}, TypeError, "recoverable_exceptions must be a tuple of exception types"),
        ({"init_fn": 1}, TypeError, "init_fn must be a callable"),
        ({"summary_dir": 3}, TypeError, "summary_dir must be a directory path or None"),
    ],
)
def test_monitored_training_session_validates(tmp_path, kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        MonitoredTrainingSession(tmp_path, *_model(), **kwargs)


def test_checkpoint_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="checkpoint_dir .* exists and is not a directory"):
        MonitoredTrainingSession(f, *_model())


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"save_model_secs": -1}, ValueError, "save_model_secs must be a non-negative number"),
        ({"save_summaries_secs": "x"}, TypeError, "save_summaries_secs must be a non-negative number"),
        ({"checkpoint_basename": "a/b"}, ValueError, "checkpoint_basename must be a plain file name"),
        ({"summary_fn": 3}, TypeError, "summary_fn must be a callable"),
        ({"recovery_wait_secs": -2}, ValueError, "recovery_wait_secs must be a non-negative number"),
        ({"handle_signals": None}, TypeError, "handle_signals must be True or False"),
        ({"hooks": Hook()}, TypeError, "hooks must be a list of supervisor.Hook instances"),
        ({"state": {"model": torch.nn.Linear(1, 1)}}, ValueError, "model= and state['model'] both name the entry"),
    ],
)
def test_supervisor_validates_at_construction(tmp_path, kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        Supervisor(tmp_path, *_model(), **kwargs)


def test_supervisor_rejects_non_path_logdir():
    with pytest.raises(TypeError, match="logdir must be a directory path or None"):
        Supervisor(42)


def test_workers_get_only_user_hooks_and_no_checkpoint_dir_means_no_saver():
    rec = RecordingHook()
    with MonitoredTrainingSession(None, *_model(), is_chief=False, hooks=[rec],
                                  chief_only_hooks=[RecordingHook()]) as s:
        assert s.hooks == (rec,)
        assert not s.is_chief and s.summary_writer is None and s.checkpoint_manager is None


def test_chief_without_directories_keeps_chief_only_then_user_hooks():
    chief, user = RecordingHook(name="chief"), RecordingHook(name="user")
    with MonitoredTrainingSession(None, *_model(), hooks=[user], chief_only_hooks=[chief]) as s:
        assert s.hooks == (chief, user)


def test_singular_session_has_no_recovery():
    from supervisor import RecoverableError

    with pytest.raises(RecoverableError):
        with SingularMonitoredSession(None, *_model()) as s:
            def step():
                raise RecoverableError("not retried")
            s.run(step)
