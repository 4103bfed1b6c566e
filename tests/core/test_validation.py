"""Bad constructor arguments: the error names the argument, the value and the fix (SPEC §11)."""
from __future__ import annotations

import re

import pytest
import torch

from supervisor import Hook, MonitoredSession, SessionCreator, TrainingState
from supervisor.testing import FakeClock


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"session_creator": "creator"}, TypeError, "session_creator must be a supervisor.SessionCreator, got 'creator'"),
        ({"hooks": Hook()}, TypeError, "hooks must be a list of supervisor.Hook instances"),
        ({"hooks": [Hook]}, TypeError, "hooks[0] is the class Hook, not an instance; write Hook(...)"),
        ({"hooks": [object()]}, TypeError, "hooks[0] must be a supervisor.Hook instance"),
        ({"hooks": "abc"}, TypeError, "hooks must be a list"),
        ({"stop_grace_secs": -1}, ValueError, "stop_grace_secs must be a non-negative number, got -1"),
        ({"stop_grace_secs": "10"}, TypeError, "stop_grace_secs must be a non-negative number, got '10'"),
        ({"stop_grace_secs": float("nan")}, ValueError, "stop_grace_secs must be a non-negative number, got nan"),
        ({"recoverable_exceptions": (int,)}, TypeError, "recoverable_exceptions must be a tuple of exception types"),
        ({"recoverable_exceptions": 5}, TypeError, "recoverable_exceptions must be a tuple of exception types"),
        ({"max_recoveries": -1}, ValueError, "max_recoveries must be a non-negative integer, got -1"),
        ({"max_recoveries": 2.5}, ValueError, "max_recoveries must be a non-negative integer, got 2.5"),
        ({"max_recoveries": True}, TypeError, "max_recoveries must be a non-negative integer, got True"),
        ({"recovery_backoff_secs": -0.5}, ValueError, "recovery_backoff_secs must be a non-negative number"),
        ({"handle_signals": "yes"}, TypeError, "handle_signals must be True or False, got 'yes'"),
        ({"clock": object()}, TypeError, "clock must provide time(), monotonic()"),
    ],
)
def test_monitored_session_arguments(kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        MonitoredSession(**kwargs)


def test_single_exception_type_is_accepted():
    MonitoredSession(recoverable_exceptions=ConnectionError, clock=FakeClock()).close()


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"state": {"model": 1}}, TypeError, "state must be a supervisor.TrainingState"),
        ({"init_fn": 3}, TypeError, "init_fn must be a callable such as init_fn(session) or None, got 3"),
        ({"local_init_fn": "f"}, TypeError, "local_init_fn must be a callable"),
        ({"ready_fn": 1.0}, TypeError, "ready_fn must be a callable"),
        ({"is_chief": 1}, TypeError, "is_chief must be True or False, got 1"),
    ],
)
def test_session_creator_arguments(kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        SessionCreator(**kwargs)


@pytest.mark.parametrize(
    "call, error, text",
    [
        (lambda: TrainingState({"model": object()}), TypeError,
         "state['model'] must have state_dict() and load_state_dict(sd) methods"),
        (lambda: TrainingState({"": torch.nn.Linear(1, 1)}), TypeError, "state names must be non-empty strings"),
        (lambda: TrainingState({"global_step": torch.nn.Linear(1, 1)}), ValueError,
         "state name 'global_step' is reserved"),
        (lambda: TrainingState({"a/b": torch.nn.Linear(1, 1)}), ValueError, "may not contain '/'"),
        (lambda: TrainingState.from_arguments(model=object()), TypeError, "model must have state_dict()"),
        (lambda: TrainingState.from_arguments(model=torch.nn.Linear(1, 1), state={"model": torch.nn.Linear(1, 1)}),
         ValueError, "model= and state['model'] both name the entry 'model'"),
        (lambda: TrainingState.from_arguments(state=[1]), TypeError, "state must be a dict of name -> object"),
    ],
)
def test_training_state_arguments(call, error, text):
    with pytest.raises(error, match=re.escape(text)):
        call()


def test_training_state_shorthands():
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # over another model's: refused (issue 34.10)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    state = TrainingState.from_arguments(model=model, optimizer=opt, state={"scheduler": sched})
    assert list(state) == ["model", "optimizer", "scheduler"]
    assert state["optimizer"] is opt and len(state) == 3


def test_fake_clock_refuses_to_go_back():
    with pytest.raises(ValueError, match="secs must be >= 0"):
        FakeClock().advance(-1)


@pytest.mark.parametrize("wait", ["yes", 1, None])
def test_save_checkpoint_wait_must_be_a_bool(tmp_path, wait):
    """Issue 22.20: wait="yes" was accepted (and meant True)."""
    from supervisor import CheckpointManager, CheckpointSessionCreator

    creator = CheckpointSessionCreator(TrainingState({"model": torch.nn.Linear(2, 1)}), CheckpointManager(tmp_path))
    with MonitoredSession(creator, clock=FakeClock()) as s:
        with pytest.raises(TypeError, match=re.escape(f"wait must be True or False, got {wait!r}")):
            s.save_checkpoint(wait=wait)
