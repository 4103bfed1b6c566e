"""SecondOrStepTimer: TF's trigger rules, by steps and by seconds, on a fake clock."""
from __future__ import annotations

import pytest

from hooks import NeverTriggerTimer, SecondOrStepTimer
from supervisor.testing import FakeClock


def test_first_step_triggers_then_every_n_steps():
    timer = SecondOrStepTimer(every_steps=10)
    fired = []
    for step in range(1, 31):
        if timer.should_trigger_for_step(step):
            timer.update_last_triggered_step(step)
            fired.append(step)
    assert fired == [1, 11, 21]


def test_same_step_never_triggers_twice():
    timer = SecondOrStepTimer(every_steps=1)
    timer.update_last_triggered_step(5)
    assert not timer.should_trigger_for_step(5)
    assert timer.should_trigger_for_step(6)


def test_seconds_schedule_uses_the_clock():
    clock = FakeClock()
    timer = SecondOrStepTimer(every_secs=2.0, clock=clock)
    assert timer.should_trigger_for_step(1)
    assert timer.update_last_triggered_step(1) == (None, None)
    clock.advance(1.999)
    assert not timer.should_trigger_for_step(2)
    clock.advance(0.001)
    assert timer.should_trigger_for_step(3)
    assert timer.update_last_triggered_step(3) == (pytest.approx(2.0), 2)
    assert timer.last_triggered_step() == 3


def test_reset_makes_the_next_step_trigger():
    timer = SecondOrStepTimer(every_steps=100)
    timer.update_last_triggered_step(7)
    assert not timer.should_trigger_for_step(8)
    timer.reset()
    assert timer.last_triggered_step() is None
    assert timer.should_trigger_for_step(8)


def test_never_trigger_timer_still_measures():
    clock = FakeClock()
    timer = NeverTriggerTimer(clock=clock)
    assert not timer.should_trigger_for_step(0)
    timer.update_last_triggered_step(0)
    clock.advance(3)
    assert timer.update_last_triggered_step(4) == (3.0, 4)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({}, ValueError, "exactly one of every_steps and every_secs"),
        ({"every_steps": 1, "every_secs": 1.0}, ValueError, "every_steps=1 and every_secs=1.0"),
        ({"every_steps": 0}, ValueError, "every_steps must be a positive integer"),
        ({"every_steps": 1.5}, ValueError, "every_steps must be a positive integer"),
        ({"every_steps": "10"}, TypeError, "every_steps"),
        ({"every_secs": 0}, ValueError, "every_secs must be a positive number"),
        ({"every_secs": -1.0}, ValueError, "every_secs"),
        ({"every_steps": 1, "clock": object()}, TypeError, "clock must provide"),
    ],
)
def test_validation(kwargs, error, words):
    with pytest.raises(error, match=words):
        SecondOrStepTimer(**kwargs)
