"""SIGTERM/SIGINT handling of the session (SPEC §5.7), in-process on the main thread."""
from __future__ import annotations

import os
import signal

import pytest

from supervisor import MonitoredSession
from supervisor.testing import RecordingHook


def _wait_for_stop(session):
    assert session.coord.wait_for_stop(5), "the signal did not request a stop"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_requests_a_clean_stop(signum):
    before = signal.getsignal(signum)
    rec = RecordingHook()
    with MonitoredSession(hooks=[rec], handle_signals=True) as s:
        s.run(lambda: None)
        os.kill(os.getpid(), signum)
        _wait_for_stop(s)
        # Between steps the stop is pending: it takes effect at the next step's boundary, so a
        # loop that already took the next batch runs it and checkpoints after it (SPEC §3.5).
        assert not s.should_stop() and s.stop_requested
        s.run(lambda: None)
        assert s.should_stop() and s.global_step == 2
        assert s.preempted
    assert rec.calls[-1] == "end"  # a clean close: end hooks ran
    assert s.stop_reason == f"received {signal.Signals(signum).name}"
    assert signal.getsignal(signum) is before  # handlers restored on exit


def test_second_sigint_interrupts_at_once():
    before = signal.getsignal(signal.SIGINT)
    rec = RecordingHook()
    with pytest.raises(KeyboardInterrupt):
        with MonitoredSession(hooks=[rec], handle_signals=True) as s:
            os.kill(os.getpid(), signal.SIGINT)
            _wait_for_stop(s)
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler raises between bytecodes
                pass
    assert rec.calls[-1] == "on_exception"
    assert signal.getsignal(signal.SIGINT) is before


def test_handlers_restored_after_an_error_close():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError):
        with MonitoredSession(handle_signals=True):
            assert signal.getsignal(signal.SIGTERM) is not before
            raise ValueError("x")
    assert signal.getsignal(signal.SIGTERM) is before


def test_no_handlers_unless_asked():
    before = signal.getsignal(signal.SIGTERM)
    with MonitoredSession():
        assert signal.getsignal(signal.SIGTERM) is before
