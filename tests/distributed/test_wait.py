"""`wait_for_global_step`: a worker waits for the chief's committed progress, with a timeout."""
from __future__ import annotations

import threading

import pytest

from supervisor.checkpoint import CheckpointManager
from supervisor.distributed import committed_step, wait_for_global_step
from supervisor.testing import FakeClock

from ..checkpoint.conftest import small_state


def test_returns_once_the_chief_committed_the_step(tmp_path):
    manager = CheckpointManager(tmp_path, save_mode="sync")
    manager.open()
    try:
        assert committed_step(tmp_path) is None
        manager.save(3, small_state())
        clock = FakeClock()
        saves = iter([5, 8])

        def commit_next(secs: float) -> None:  # the chief commits while the worker sleeps
            manager.save(next(saves), small_state())

        clock.sleep = commit_next  # type: ignore[method-assign]
        assert wait_for_global_step(tmp_path, 7, timeout_secs=60, poll_secs=1, clock=clock) == 8
    finally:
        manager.close()


def test_times_out_naming_the_logdir_the_step_and_what_it_saw(tmp_path):
    manager = CheckpointManager(tmp_path, save_mode="sync")
    with manager:
        manager.save(2, small_state())
    clock = FakeClock()
    start = clock.monotonic()
    with pytest.raises(TimeoutError) as info:
        wait_for_global_step(tmp_path, 10, timeout_secs=30, poll_secs=1, clock=clock)
    message = str(info.value)
    assert "step 10" in message and str(tmp_path) in message and "newest committed step is 2" in message
    assert clock.monotonic() - start == 30  # never sleeps past the timeout


def test_ends_early_when_asked_to_stop(tmp_path):
    stop = threading.Event()
    stop.set()
    assert wait_for_global_step(tmp_path, 10, timeout_secs=None, should_stop=stop.is_set,
                                clock=FakeClock()) is None


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="poll_secs"):
        wait_for_global_step("x", 1, poll_secs=0)


def test_global_step_waiter_hook_times_out_naming_the_step(tmp_path):
    from hooks import GlobalStepWaiterHook
    from supervisor import MonitoredSession, SessionCreator

    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-40"\n')
    clock = FakeClock()
    hook = GlobalStepWaiterHook(100, poll_secs=1.0, timeout_secs=10, clock=clock)
    with pytest.raises(TimeoutError, match=r"timeout_secs=10\) for global step 100; the step is 40"):
        with MonitoredSession(SessionCreator(logdir=str(tmp_path)), hooks=[hook], clock=clock) as s:
            s.run(lambda: None)
