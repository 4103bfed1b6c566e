"""StopAtStepHook and StopAtSecsHook through a real MonitoredSession."""
from __future__ import annotations

import pytest

from hooks import StopAtSecsHook, StopAtStepHook
from supervisor import MonitoredSession, RecoverableError
from supervisor.testing import FakeClock, RecordingHook

from tests.hooks._helpers import RestoredAt, loss_step, run_steps


@pytest.mark.parametrize(
    ("hook_kwargs", "restored_step", "stop_step"),
    [
        ({"num_steps": 3}, 0, 3),
        ({"num_steps": 3}, 3, 6),  # counted from the step at session creation (after restore)
        ({"last_step": 5}, 0, 5),
        ({"last_step": 5}, 2, 5),
        ({"last_step": 1}, 0, 1),
    ],
)
def test_stops_at_the_step(hook_kwargs, restored_step, stop_step):
    recorder = RecordingHook()
    session = run_steps([StopAtStepHook(**hook_kwargs), recorder], 100, creator=RestoredAt(restored_step))
    assert session.global_step == stop_step
    assert recorder.calls.count("after_run") == stop_step - restored_step
    assert recorder.calls[-1] == "end"


def test_session_created_beyond_last_step_runs_no_step():
    hook = StopAtStepHook(last_step=5)
    with MonitoredSession(RestoredAt(8), hooks=[hook]) as session:
        assert session.should_stop()
        with pytest.raises(RuntimeError, match="should_stop"):
            session.run(loss_step)
    assert session.global_step == 8


def test_num_steps_is_computed_once_across_recoveries():
    failures = iter([RecoverableError("lost a worker")])

    def flaky_step():
        if session.global_step == 2:
            error = next(failures, None)
            if error is not None:
                raise error
        return loss_step()

    hook = StopAtStepHook(num_steps=5)
    recorder = RecordingHook()
    with MonitoredSession(hooks=[hook, recorder], clock=FakeClock()) as session:
        while not session.should_stop():
            session.run(flaky_step)
    assert recorder.calls.count("after_create_session") == 2  # it did recover
    assert hook.last_step == 5
    assert session.global_step == 5


def test_stop_at_secs_counts_from_begin(clock):
    hook = StopAtSecsHook(10, clock=clock)
    session = run_steps([hook], 100, clock=clock, advance_secs=3.0)
    # 3, 6, 9 s: still running; 12 s >= 10 s after step 4.
    assert session.global_step == 4


def test_stop_at_secs_ignores_time_before_begin(clock):
    hook = StopAtSecsHook(5, clock=clock)
    clock.advance(100)  # constructed long before the session began
    session = run_steps([hook], 100, clock=clock, advance_secs=1.0)
    assert session.global_step == 5
