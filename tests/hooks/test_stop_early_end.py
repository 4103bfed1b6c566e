"""StopAtStepHook says in one INFO line when training ends before its last step (SPEC §3.3)."""
from __future__ import annotations

import logging

from hooks import StopAtStepHook
from supervisor import MonitoredSession

from tests.hooks._helpers import loss_step


def _lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "hooks.stop" and r.levelno == logging.INFO]


def test_data_running_out_before_last_step_is_said(caplog):
    caplog.set_level(logging.INFO)
    batches = iter(range(3))
    with MonitoredSession(hooks=[StopAtStepHook(last_step=10)]) as s:
        while not s.should_stop():
            s.run(lambda b: loss_step(), next(batches))  # the 4th next() raises StopIteration
    assert s.global_step == 3
    (line,) = _lines(caplog)
    assert "training ended at step 3, 7 step(s) before last_step=10" in line
    assert "the data ran out (StopIteration)" in line and "while not s.should_stop()" in line


def test_a_loop_that_ends_before_last_step_is_said(caplog):
    caplog.set_level(logging.INFO)
    with MonitoredSession(hooks=[StopAtStepHook(num_steps=10)]) as s:
        for _ in range(4):  # one pass over the "data", no outer loop
            s.run(loss_step)
    (line,) = _lines(caplog)
    assert "training ended at step 4, 6 step(s) before last_step=10" in line and "`with` block ended" in line


def test_nothing_is_said_when_last_step_is_reached(caplog):
    caplog.set_level(logging.INFO)
    with MonitoredSession(hooks=[StopAtStepHook(last_step=3)]) as s:
        while not s.should_stop():
            s.run(loss_step)
    assert _lines(caplog) == []
