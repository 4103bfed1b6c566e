"""Session creation with checkpoints (SPEC §4): restore-or-init on the chief, wait-and-restore on
workers."""
from __future__ import annotations

import logging
import threading

import pytest
import torch

from supervisor import MonitoredSession, RecoverableError
from supervisor.checkpoint import CheckpointManager, CheckpointSessionCreator, WorkerSessionCreator, latest_checkpoint
from supervisor.errors import CheckpointCorruptError
from supervisor.testing import FakeClock

from .conftest import small_state, train_step


def _session(logdir, state, clock, **kwargs):
    manager = CheckpointManager(logdir, clock=clock)
    return MonitoredSession(CheckpointSessionCreator(state, manager, **kwargs), clock=clock)


def test_fresh_start_calls_init_fn_then_resume_restores_step_and_weights(tmp_path, clock, caplog):
    logdir = tmp_path / "logdir"
    calls = []
    state = small_state()
    with caplog.at_level(logging.INFO, logger="supervisor.creators"):
        with _session(logdir, state, clock, init_fn=lambda s: calls.append("init")) as session:
            for _ in range(3):
                session.run(train_step, state, session.global_step)
            path = session.save_checkpoint(wait=True)
    assert calls == ["init"]
    assert path == str(logdir / "model.ckpt-3")
    assert "initialised from scratch" in caplog.messages

    resumed = small_state(seed=4)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="supervisor.creators"):
        with _session(logdir, resumed, clock, init_fn=lambda s: calls.append("init again")) as session:
            assert session.global_step == 3
            assert session.checkpoint_manager.last_saved_step == 3
    assert calls == ["init"]  # not called when restored
    assert f"restored step=3 from {path}" in caplog.messages
    for key, value in state["model"].state_dict().items():
        assert torch.equal(resumed["model"].state_dict()[key], value)


def test_recovery_recreates_the_session_from_the_latest_checkpoint(tmp_path, clock):
    state = small_state()
    failures = []

    def flaky(step):
        if step == 2 and not failures:
            with torch.no_grad():
                state["model"][0].weight.add_(100.0)  # a half-done step that must be undone
            failures.append(step)
            raise RecoverableError("lost a peer")
        train_step(state, step)

    with _session(tmp_path / "logdir", state, clock) as session:
        for _ in range(2):
            session.run(flaky, session.global_step)
        session.save_checkpoint()  # async: the re-creation must wait for it and restore it
        session.run(flaky, session.global_step)  # fails once, recovers, retries
        assert session.global_step == 3
    assert failures == [2]

    reference = small_state()
    for step in range(3):
        train_step(reference, step)
    for key, value in reference["model"].state_dict().items():
        assert torch.equal(state["model"].state_dict()[key], value)  # bit for bit


def test_the_manager_lock_is_released_when_session_creation_fails(tmp_path, clock):
    logdir = tmp_path / "logdir"
    with _session(logdir, small_state(), clock) as session:
        session.save_checkpoint(wait=True)
    (logdir / "model.ckpt-0" / "state.pt").write_bytes(b"garbage")
    manager = CheckpointManager(logdir, clock=clock)
    with pytest.raises(CheckpointCorruptError):
        MonitoredSession(CheckpointSessionCreator(small_state(), manager), clock=clock)
    CheckpointManager(logdir, clock=clock).open()  # lock free again
    assert not manager._lock.held


def test_worker_waits_for_the_chiefs_checkpoint_then_restores_it(tmp_path):
    logdir = tmp_path / "logdir"
    clock = FakeClock()
    chief_state = small_state()
    train_step(chief_state, 1)
    polls = []

    def chief_writes_after_two_polls(event, secs):
        polls.append(secs)
        if len(polls) == 2:
            with CheckpointManager(logdir, clock=clock) as manager:
                manager.save(7, chief_state, wait=True)
        clock.advance(secs)
        return event.is_set()

    clock.wait = chief_writes_after_two_polls
    worker_state = small_state(seed=3)
    creator = WorkerSessionCreator(worker_state, logdir, recovery_wait_secs=5, clock=clock)
    with MonitoredSession(creator, clock=clock) as session:
        assert session.global_step == 7
        assert not session.is_chief
        with pytest.raises(RuntimeError, match="not the chief"):
            session.save_checkpoint()
    assert polls == [5, 5]
    assert torch.equal(worker_state["model"][0].weight, chief_state["model"][0].weight)


def test_worker_times_out_naming_the_directory(tmp_path):
    clock = FakeClock()
    clock.wait = lambda event, secs: (clock.advance(secs), event.is_set())[1]  # nobody else advances it
    creator = WorkerSessionCreator(small_state(), tmp_path / "nothing", max_wait_secs=60,
                                   recovery_wait_secs=25, clock=clock)
    with pytest.raises(TimeoutError) as info:
        MonitoredSession(creator, clock=clock)
    message = str(info.value)
    assert str(tmp_path / "nothing") in message and "max_wait_secs=60" in message
    assert "chief's first verified checkpoint" in message
    assert clock.monotonic() - 1_000_000.0 == 60  # 25 + 25 + 10, on the fake clock


def test_worker_never_takes_the_lock(tmp_path, clock):
    logdir = tmp_path / "logdir"
    with CheckpointManager(logdir, clock=clock) as chief:
        chief.save(1, small_state(), wait=True)
        creator = WorkerSessionCreator(small_state(seed=2), logdir, clock=clock)
        with MonitoredSession(creator, clock=clock) as session:
            assert session.global_step == 1


@pytest.mark.parametrize("kwargs, error, match", [
    ({"max_to_keep": 0}, ValueError, "max_to_keep must be a positive integer or None, got 0"),
    ({"save_mode": "background"}, ValueError, "save_mode must be one of 'async', 'sync', got 'background'"),
    ({"verify": "none"}, ValueError, "verify must be one of"),
    ({"keep_checkpoint_every_n_hours": -1}, ValueError, "keep_checkpoint_every_n_hours must be a positive"),
    ({"max_consecutive_save_failures": 0}, ValueError, "max_consecutive_save_failures must be a positive"),
    ({"save_rng": 1}, TypeError, "save_rng must be True or False"),
    ({"basename": "a/b"}, ValueError, "basename must be a plain file name"),
    ({"on_error": "stop"}, TypeError, "on_error must be a callable"),
    ({"clock": object()}, TypeError, "clock must provide"),
])
def test_manager_arguments_are_validated(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        CheckpointManager(tmp_path, **kwargs)


def test_save_before_open_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="call open"):
        CheckpointManager(tmp_path).save(1, small_state())


def test_closing_the_session_finishes_the_save_in_flight(tmp_path, clock):
    from .conftest import GatedOpener

    gate = GatedOpener()
    manager = CheckpointManager(tmp_path / "logdir", clock=clock, opener=gate)
    session = MonitoredSession(CheckpointSessionCreator(small_state(), manager), clock=clock)
    path = session.save_checkpoint()
    assert gate.writing.wait(10)
    closer = threading.Thread(target=session.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close must wait for the save in flight"
    gate.release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert latest_checkpoint(tmp_path / "logdir") == path
    assert not [t for t in threading.enumerate() if t.name == "supervisor-checkpoint-writer"]
