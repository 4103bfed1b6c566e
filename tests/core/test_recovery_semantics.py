"""TF's recovery semantics (SPEC §3.3): run_step_fn re-runs the whole step_fn, recoverable
errors reported by threads and raised during creation recover, bounded like a failed step."""
from __future__ import annotations

import threading

import pytest
import torch

from supervisor import (
    CheckpointManager,
    CheckpointSessionCreator,
    Hook,
    MonitoredSession,
    RecoverableError,
    SessionCreator,
    Supervisor,
    TrainingState,
)
from hooks import StopAtStepHook
from supervisor.testing import FakeClock, RecordingHook


class Weight(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.0), requires_grad=False)


def test_run_step_fn_retries_the_whole_step_fn_after_a_restore(tmp_path):
    model = Weight()
    creator = CheckpointSessionCreator(TrainingState({"model": model}), CheckpointManager(tmp_path))
    failures = [RecoverableError("transient")]

    def inner():
        if failures:
            raise failures.pop()
        model.w.add_(10)

    def step_fn(step_context):
        model.w.add_(1)  # the part of step_fn before run_with_hooks must run again too
        step_context.run_with_hooks(inner)

    with MonitoredSession(creator, clock=FakeClock()) as s:
        s.save_checkpoint(wait=True)  # w = 1.0 on disk
        s.run_step_fn(step_fn)
        assert s.global_step == 1
    # restored 1.0, then the whole step_fn once: + 1 + 10 (retrying only run_with_hooks gave 11)
    assert model.w.item() == 12.0


class ReportsFromAThread(Hook):
    """Starts a service thread that reports a recoverable error to the coordinator once."""

    def __init__(self) -> None:
        self.reported = threading.Event()
        self.creations = 0

    def after_create_session(self, session, coord):
        self.creations += 1
        if self.creations == 1:
            def service():
                coord.request_stop(RecoverableError("lost the parameter server"))
                self.reported.set()
            thread = threading.Thread(target=service, name="flaky-service")
            coord.register_thread(thread)
            thread.start()


def test_recoverable_error_reported_by_a_thread_recovers():
    hook = ReportsFromAThread()
    rec = RecordingHook()
    with MonitoredSession(hooks=[hook, StopAtStepHook(last_step=5), rec], clock=FakeClock()) as s:
        assert hook.reported.wait(5)
        assert not s.should_stop()  # a recoverable error does not end the loop...
        while not s.should_stop():
            s.run(lambda: None)
    assert hook.creations == 2  # ...the next run re-created the session
    assert s.global_step == 5
    assert rec.calls[-1] == "end"


def test_supervisor_recovers_from_a_loop_thread_and_restarts_it(tmp_path):
    model = Weight()
    calls = []
    failed, again, recorder = threading.Event(), threading.Event(), RecordingHook()
    sv = Supervisor(tmp_path, model=model, hooks=[StopAtStepHook(last_step=40), recorder],
                    save_summaries_secs=0, handle_signals=False, recovery_wait_secs=0)

    def service():
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            failed.set()
            raise RecoverableError("service hiccup")
        again.set()

    with sv.managed_session() as s:
        sv.loop(0.001, service)
        assert failed.wait(30), "the service never ran"  # the handshakes: it failed once...
        while not s.should_stop():
            s.run(lambda: None)
            if recorder.calls.count("after_create_session") == 2:  # ...the session was re-created...
                assert again.wait(30), "the service was not restarted after the recovery"  # ...it ran again
    assert s.global_step == 40 and recorder.calls.count("after_create_session") == 2
    assert len(calls) >= 2  # the loop thread ran again after the recovery


def test_recoverable_error_in_init_fn_is_retried():
    attempts = []

    def init_fn(session):
        attempts.append(1)
        if len(attempts) == 1:
            raise RecoverableError("the data service is not up yet")

    clock = FakeClock()
    rec = RecordingHook()
    with MonitoredSession(SessionCreator(TrainingState(), init_fn=init_fn), hooks=[rec], clock=clock) as s:
        s.run(lambda: None)
    assert len(attempts) == 2  # init_fn ran again: nothing was restored
    assert rec.calls.count("begin") == 1 and rec.calls.count("after_create_session") == 1
    assert clock.monotonic() == 1_000_000.0 + 1.0  # one backoff


def test_creation_retries_are_bounded():
    def init_fn(session):
        raise RecoverableError("never up")

    with pytest.raises(RecoverableError, match="never up"):
        MonitoredSession(SessionCreator(TrainingState(), init_fn=init_fn), max_recoveries=2, clock=FakeClock())


def test_without_a_checkpoint_dir_recovery_keeps_step_and_state_consistent():
    counter = {"applied": 0}
    failures = [RecoverableError("flaky")]

    def step():
        if counter["applied"] == 2 and failures:
            raise failures.pop()  # fails before changing anything
        counter["applied"] += 1

    with MonitoredSession(clock=FakeClock()) as s:
        for _ in range(4):
            s.run(step)
        # in memory: nothing to restore; the step count matches the updates applied
        assert s.global_step == counter["applied"] == 4


def _signal_once_in(function: str, sig: int, timeout_secs: float = 30) -> None:
    """Sends ``sig`` to this process once the main thread is inside ``function`` (the
    handshake: its stack says so), or gives up after ``timeout_secs`` (the test then fails)."""
    import os
    import sys
    import time

    main, deadline = threading.main_thread().ident, time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code.co_name != function:
            frame = frame.f_back
        if frame is not None:
            os.kill(os.getpid(), sig)
            return
        time.sleep(0.001)


def test_sigterm_during_a_recovery_backoff_ends_the_wait_and_stops():
    import os
    import signal
    import time

    failures = [RecoverableError("flaky")]

    def step():
        if failures:
            raise failures.pop()

    signaller = threading.Thread(target=_signal_once_in, args=("_wait_backoff", signal.SIGTERM), name="signaller")
    start = time.monotonic()
    with MonitoredSession(recovery_backoff_secs=60, handle_signals=True) as s:
        signaller.start()
        s.run(step)  # fails, backs off (60 s) — the SIGTERM ends the wait, the retry succeeds
        assert s.should_stop()  # and the signal's stop applied at that step's boundary
    signaller.join(30)
    assert time.monotonic() - start < 30
    assert s.preempted and s.stop_reason == "received SIGTERM" and s.global_step == 1


class _ManyRanks:
    """An agreement as a distributed job has one: not local (decisions are the identity here)."""

    def __new__(cls):
        from supervisor.engine.boundary import Agreement

        class Collective(Agreement):
            local = False

        return Collective()


def test_a_recoverable_error_in_a_distributed_job_ends_the_rank_instead_of_recovering_alone(caplog):
    created = []

    class Counting(SessionCreator):
        def create(self, session):
            created.append(session.global_step)
            return super().create(session)

    session = MonitoredSession(Counting(), agreement=_ManyRanks(), max_recoveries=3,
                               recovery_backoff_secs=0, clock=FakeClock())
    with pytest.raises(RecoverableError, match="transient"):
        with session as s:
            s.run(lambda: None)
            s.run(lambda: (_ for _ in ()).throw(RecoverableError("transient")))
    assert created == [0]  # never re-created on this rank alone
    assert "torchrun --max-restarts" in caplog.text and "not recovered" in caplog.text


class StopCoordinatorWithException(Hook):
    """TF's hook of the same name: a side thread reports a recoverable error to the coordinator
    during the ``calls_before_stopping``-th ``after_run``, which waits until it is reported."""

    def __init__(self, calls_before_stopping: int) -> None:
        self._calls_before_stopping = calls_before_stopping
        self._lock = threading.Lock()
        self._reported = threading.Event()
        self._started = False

    def _maybe_stop_with_exception(self, coord):
        while not coord.should_stop():
            with self._lock:
                if self._calls_before_stopping == 0:
                    coord.request_stop(RecoverableError("Aborted at N"))
                    self._reported.set()
                    return
            threading.Event().wait(0.001)

    def after_create_session(self, session, coord):
        if self._started:
            return
        thread = threading.Thread(target=self._maybe_stop_with_exception, args=(coord,), name="side-thread")
        coord.register_thread(thread)
        thread.start()
        self._started = True

    def after_run(self, run_context, run_values):
        with self._lock:
            self._calls_before_stopping -= 1
            stopping_now = self._calls_before_stopping == 0
        if stopping_now:
            assert self._reported.wait(10)


class CountingSessionCreator(SessionCreator):
    def __init__(self) -> None:
        super().__init__()
        self.number_of_sessions_created = 0

    def create(self, session):
        self.number_of_sessions_created += 1
        return super().create(session)


@pytest.mark.timeout(60)
def test_recovery_from_coordinator_exception():
    """TF's RecoverableSessionTest.test_recovery_from_coordinator_exception (SPEC §3.5, issue
    22.4): an error reported during step 2's after_run is recovered at that step's boundary."""
    creator = CountingSessionCreator()
    session = MonitoredSession(creator, [StopCoordinatorWithException(calls_before_stopping=2)], clock=FakeClock())
    assert creator.number_of_sessions_created == 1
    assert not session.should_stop()
    assert session.run(lambda: 51) == 51
    assert not session.should_stop()
    assert session.run(lambda: 42) == 42  # the coordinator is stopped with the error during this run
    # The session was re-created at the end of that step, and training continues.
    assert not session.should_stop()
    assert creator.number_of_sessions_created == 2
    assert session.global_step == 2
    session.close()  # nothing left to raise
