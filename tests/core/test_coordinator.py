"""Coordinator and LooperThread: TF semantics (SPEC §3.4)."""
from __future__ import annotations

import threading

import pytest

from supervisor import Coordinator, LooperThread
from supervisor.testing import FakeClock


def test_first_exception_wins_and_join_reraises_it():
    coord = Coordinator()
    first, second = ValueError("first"), KeyError("second")
    coord.request_stop(first)
    coord.request_stop(second)
    assert coord.should_stop()
    with pytest.raises(ValueError, match="first") as info:
        coord.join([])
    assert info.value is first


def test_stop_without_exception_then_exception_is_not_recorded():
    # Only the first stop request may carry an exception (TF semantics).
    coord = Coordinator()
    coord.request_stop()
    coord.request_stop(ValueError("late"))
    coord.join([])  # nothing recorded, nothing raised


def test_stop_iteration_is_a_clean_stop():
    coord = Coordinator()
    coord.request_stop(StopIteration())
    assert coord.should_stop() and coord.exception is None
    coord.join([])


def test_stop_on_exception_records_and_does_not_raise():
    coord = Coordinator()
    with coord.stop_on_exception():
        raise RuntimeError("boom")
    assert coord.should_stop()
    with pytest.raises(RuntimeError, match="boom"):
        coord.raise_requested_exception()


def test_traceback_is_preserved():
    coord = Coordinator()

    def fails():
        raise ValueError("deep")

    with coord.stop_on_exception():
        fails()
    with pytest.raises(ValueError) as info:
        coord.join([])
    frames = [f.name for f in info.traceback]
    assert "fails" in frames


def test_wait_for_stop_times_out_then_returns_true():
    coord = Coordinator()
    assert coord.wait_for_stop(0.01) is False
    coord.request_stop()
    assert coord.wait_for_stop(0.01) is True


def test_clear_stop_resets_everything():
    coord = Coordinator()
    coord.request_stop(ValueError("x"))
    with pytest.raises(ValueError):
        coord.join([])
    coord.clear_stop()
    assert not coord.should_stop()
    coord.raise_requested_exception()  # nothing recorded any more
    coord.request_stop(KeyError("y"))
    assert isinstance(coord.exception, KeyError)
    with pytest.raises(KeyError):
        coord.join([])


def test_join_reraises_before_naming_stragglers():
    coord = Coordinator()
    release = threading.Event()
    straggler = threading.Thread(target=release.wait, name="straggler", daemon=True)
    straggler.start()
    coord.request_stop(ValueError("first"))
    try:
        with pytest.raises(ValueError, match="first"):
            coord.join([straggler], stop_grace_secs=0.05)
    finally:
        release.set()
        straggler.join(5)
    assert not straggler.is_alive()


def test_join_names_stragglers():
    coord = Coordinator()
    release = threading.Event()
    straggler = threading.Thread(target=release.wait, name="slow-writer", daemon=True)
    straggler.start()
    coord.register_thread(straggler)
    coord.request_stop()
    try:
        with pytest.raises(RuntimeError, match="slow-writer"):
            coord.join(stop_grace_secs=0.05)
    finally:
        release.set()
        straggler.join(5)


def test_join_ignore_live_threads_logs_instead(caplog):
    coord = Coordinator()
    release = threading.Event()
    straggler = threading.Thread(target=release.wait, name="lingering", daemon=True)
    straggler.start()
    coord.request_stop()
    try:
        with caplog.at_level("INFO", logger="supervisor.engine.coordinator"):
            coord.join([straggler], stop_grace_secs=0.01, ignore_live_threads=True)
    finally:
        release.set()
        straggler.join(5)
    assert "lingering" in caplog.text


def test_join_waits_for_threads_that_end_on_their_own():
    coord = Coordinator()
    done = []
    t = threading.Thread(target=lambda: done.append(1))
    coord.register_thread(t)
    t.start()
    coord.join()  # no stop requested: returns once the thread ends
    assert done == [1] and not t.is_alive()


def test_request_stop_after_join_raises_the_exception():
    coord = Coordinator()
    coord.request_stop()
    coord.join([])
    with pytest.raises(ValueError, match="lost otherwise"):
        coord.request_stop(ValueError("lost otherwise"))


def test_looper_first_call_immediately_then_fixed_rate():
    clock, coord = FakeClock(), Coordinator()
    calls = []
    looper = LooperThread(coord, 10.0, lambda: calls.append(clock.monotonic()), clock=clock)
    start = clock.monotonic()
    looper.start()
    clock.wait_for_waiters(1)
    assert calls == [start]
    clock.advance(9.9)
    clock.wait_for_waiters(1)
    assert len(calls) == 1
    clock.advance(0.1)
    _wait_until(lambda: len(calls) == 2)
    clock.advance(10.0)
    _wait_until(lambda: len(calls) == 3)
    assert [c - start for c in calls] == [0.0, 10.0, 20.0]
    coord.request_stop()
    coord.join([looper], stop_grace_secs=5)
    assert not looper.is_alive()


def test_looper_skips_missed_ticks_instead_of_bursting():
    clock, coord = FakeClock(), Coordinator()
    calls = []
    looper = LooperThread(coord, 1.0, lambda: calls.append(clock.monotonic()), clock=clock)
    start = clock.monotonic()
    looper.start()
    clock.wait_for_waiters(1)
    clock.advance(5.5)  # five ticks missed while "busy"
    _wait_until(lambda: len(calls) == 2)
    clock.wait_for_waiters(1)
    assert len(calls) == 2  # one call, not five
    clock.advance(0.5)  # the schedule keeps its phase: next at start + 6
    _wait_until(lambda: len(calls) == 3)
    assert calls[2] - start == 6.0
    coord.request_stop()
    coord.join([looper], stop_grace_secs=5)


def test_looper_stops_at_once_on_request_without_waiting_for_the_interval():
    coord = Coordinator()
    looper = LooperThread(coord, 3600.0, lambda: None)  # real clock, an hour
    looper.start()
    coord.request_stop()
    coord.join([looper], stop_grace_secs=5)
    assert not looper.is_alive()


def test_looper_exception_reaches_coordinator():
    clock, coord = FakeClock(), Coordinator()

    def broken():
        raise OSError("disk gone")

    looper = LooperThread(coord, 1.0, broken, clock=clock)
    looper.start()
    assert coord.wait_for_stop(5)
    with pytest.raises(OSError, match="disk gone"):
        coord.join(stop_grace_secs=5)
    assert not looper.is_alive()


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"interval_secs": -1}, ValueError, "interval_secs must be a non-negative number or None, got -1"),
        ({"interval_secs": float("inf")}, ValueError, "interval_secs must be a non-negative finite number"),
        ({"interval_secs": "5"}, TypeError, "interval_secs must be a non-negative number or None, got '5'"),
        ({"target": None}, TypeError, "target must be a callable"),
        ({"coord": object()}, TypeError, "coord must be a supervisor.Coordinator"),
        ({"clock": object()}, TypeError, "clock must provide time()"),
    ],
)
def test_looper_validates_arguments(kwargs, error, text):
    args = {"coord": Coordinator(), "interval_secs": 1.0, "target": lambda: None, **kwargs}
    clock = args.pop("clock", None)
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        LooperThread(args["coord"], args["interval_secs"], args["target"], clock=clock)


def test_join_validates_grace():
    with pytest.raises(ValueError, match="stop_grace_secs must be a non-negative number, got -1"):
        Coordinator().join([], stop_grace_secs=-1)


def _wait_until(predicate, timeout_secs=5.0):
    done = threading.Event()
    for _ in range(int(timeout_secs / 0.005)):
        if predicate():
            return
        done.wait(0.005)
    raise AssertionError("condition not reached in time")
