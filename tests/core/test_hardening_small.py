"""Issue 9 findings 2 (hook overdue), 7 and 10, and issue 8 item 6's small defects, in process."""
from __future__ import annotations

import logging
import threading

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hooks import CheckpointSaverHook, CheckpointSaverListener
from supervisor import Coordinator, Hook, LooperThread, MonitoredSession, MonitoredTrainingSession, Supervisor
from supervisor.checkpoint import checkpoints_iterator
from supervisor.errors import LogdirInUseError


# ---------------------------------------------------------------- issue 8 item 6
@pytest.mark.parametrize("interval", [0, None])
def test_looper_with_interval_zero_or_none_runs_back_to_back(interval):
    coord = Coordinator()
    calls = []

    def target():
        calls.append(1)
        if len(calls) == 50:
            coord.request_stop()

    thread = LooperThread(coord, interval, target)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(calls) == 50


def _stop_lines(caplog):
    return [r for r in caplog.records if r.levelno == logging.INFO
            and ("stop requested" in r.getMessage() or "stopping at step" in r.getMessage())]


def test_one_stop_with_an_error_is_logged_once(caplog):
    caplog.set_level(logging.INFO)
    session = MonitoredSession()
    session.request_stop(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        session.close()
    assert len(_stop_lines(caplog)) == 1, [r.getMessage() for r in _stop_lines(caplog)]


def test_one_clean_stop_is_logged_once(caplog):
    caplog.set_level(logging.INFO)
    with MonitoredSession() as session:
        session.request_stop(reason="enough")
    assert [r.getMessage() for r in _stop_lines(caplog)] == ["stopping at step 0: enough"]


def test_refused_second_writer_leaves_the_first_sessions_summary_writer_open(tmp_path):
    logdir = str(tmp_path / "run")
    first = MonitoredTrainingSession(logdir, model=torch.nn.Linear(2, 2), save_summaries_steps=1,
                                     save_checkpoint_secs=None, save_checkpoint_steps=1, handle_signals=False)
    with first:
        first.run(lambda: 1.0)
        with pytest.raises(LogdirInUseError):
            MonitoredTrainingSession(logdir, model=torch.nn.Linear(2, 2), handle_signals=False)
        assert not first.summary_writer.closed
        first.run(lambda: 1.0)
        first.save_checkpoint(wait=True)
        first.summary_writer.add_scalar("after_refusal", 1.0, first.global_step)
    accumulator = EventAccumulator(logdir)
    accumulator.Reload()
    assert "after_refusal" in accumulator.Tags()["scalars"]


# ---------------------------------------------------------------- issue 9 finding 7
def test_thread_outliving_the_grace_period_is_named_in_the_error():
    gate = threading.Event()
    coord = Coordinator()
    stuck = threading.Thread(target=gate.wait, name="stuck-service", daemon=True)
    coord.register_thread(stuck)
    stuck.start()
    try:
        with pytest.raises(ValueError) as info:
            with MonitoredSession(coord=coord, stop_grace_secs=0.05):
                raise ValueError("the body failed")
        assert any("stuck-service" in note for note in getattr(info.value, "__notes__", ())), info.value
    finally:
        gate.set()
        stuck.join(timeout=5)


def test_looper_outliving_the_grace_period_is_named_when_a_thread_failed():
    gate = threading.Event()
    coord = Coordinator()
    LooperThread(coord, 0.01, lambda: gate.wait(), name="LooperThread-slow").start()
    failing = LooperThread(coord, 0.01, lambda: 1 / 0, name="LooperThread-failing")
    failing.start()
    try:
        with pytest.raises(ZeroDivisionError) as info:
            coord.join(stop_grace_secs=0.05)
        assert "LooperThread-slow" in "".join(info.value.__notes__)
    finally:
        gate.set()
    for thread in threading.enumerate():
        if thread.name in ("LooperThread-slow", "LooperThread-failing"):
            thread.join(timeout=5)


# ---------------------------------------------------------------- issue 9 finding 2 (in process)
class _SlowEnd(Hook):
    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def end(self, session):
        self.gate.wait(timeout=10)


def test_hook_still_running_after_the_grace_period_is_named_in_a_warning(caplog):
    gate = threading.Event()
    caplog.set_level(logging.WARNING)

    def release_when_warned():
        while not any("_SlowEnd.end() is still running" in r.getMessage() for r in caplog.records):
            if gate.wait(0.01):
                return
        gate.set()

    helper = threading.Thread(target=release_when_warned)
    helper.start()
    with MonitoredSession(hooks=[_SlowEnd(gate)], stop_grace_secs=0.1):
        pass
    helper.join(timeout=10)
    assert "_SlowEnd.end() is still running 0.1 s (stop_grace_secs)" in caplog.text


# ---------------------------------------------------------------- issue 9 finding 10
@pytest.mark.parametrize("make, match", [
    (lambda d: Supervisor(d, save_model_secs=float("inf")), "save_model_secs must be a non-negative finite number"),
    (lambda d: MonitoredTrainingSession(d, save_checkpoint_secs=float("inf")), "save_checkpoint_secs"),
    (lambda d: MonitoredSession(recoverable_exceptions=5), "recoverable_exceptions .* got 5$"),
    (lambda d: MonitoredSession(recoverable_exceptions="ValueError"), "got 'ValueError'$"),
    (lambda d: checkpoints_iterator(d, min_interval_secs=-1), "min_interval_secs must be a non-negative number"),
    (lambda d: checkpoints_iterator(d, timeout_fn="later"), "timeout_fn must be a callable"),
    (lambda d: CheckpointSaverHook(d, save_steps=1, checkpoint_basename="a/b"),
     "checkpoint_basename must be a plain file name such as 'model.ckpt', got 'a/b'"),
    (lambda d: MonitoredTrainingSession(d, stop_grace_secs=float("inf")), "stop_grace_secs"),
], ids=["save_model_secs=inf", "save_checkpoint_secs=inf", "recoverable=5", "recoverable=str",
        "iterator min_interval", "iterator timeout_fn", "hook basename", "stop_grace_secs=inf"])
def test_bad_arguments_are_refused_at_construction(tmp_path, make, match):
    before = set(threading.enumerate())
    with pytest.raises((ValueError, TypeError), match=match):
        make(str(tmp_path / "run"))
    assert set(threading.enumerate()) <= before


def test_a_single_listener_is_accepted(tmp_path):
    class Counting(CheckpointSaverListener):
        saves = 0

        def after_save(self, session, step):
            Counting.saves += 1

    hook = CheckpointSaverHook(str(tmp_path), save_steps=1, listeners=Counting())
    with MonitoredTrainingSession(str(tmp_path), model=torch.nn.Linear(2, 2), hooks=[hook],
                                  save_checkpoint_secs=None, save_summaries_steps=None,
                                  log_step_count_steps=None, handle_signals=False) as s:
        s.run(lambda: None)
    assert Counting.saves >= 1


# ---------------------------------------------------------------- issue 9 finding 2: duplicates
def test_a_duplicate_sigterm_right_after_the_first_does_not_interrupt(caplog):
    """A launcher forwarding the scheduler's SIGTERM makes two arrive together: that is still
    one clean stop (with its final checkpoint), not an escalation."""
    import os
    import signal
    import time

    caplog.set_level(logging.INFO)
    with MonitoredSession(handle_signals=True) as session:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # no KeyboardInterrupt
        deadline = time.monotonic() + 10
        while not session.stop_requested and time.monotonic() < deadline:
            time.sleep(0.01)
        session.run(lambda: None)
        assert session.should_stop()
    assert "ignoring a second SIGTERM" in caplog.text
