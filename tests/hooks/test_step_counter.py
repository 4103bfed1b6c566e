"""StepCounterHook: global_step/sec at TF's steps, writer resolution, stalled-step warning."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hooks import StepCounterHook
from supervisor import MonitoredSession, RecoverableError, SessionCreator
from supervisor.summary import SummaryWriterCache
from supervisor.testing import FakeClock, InMemorySummaryWriter

from tests.hooks._helpers import loss_step, run_steps

TAG = "global_step/sec"


@pytest.mark.parametrize(
    ("schedule", "advance_secs", "steps", "rates"),
    [
        ({"every_n_steps": 10}, 0.5, [11, 21], [2.0, 2.0]),
        ({"every_n_steps": 5}, 0.25, [6, 11, 16, 21, 26], [4.0] * 5),
        # By seconds: the first step (t=0.5) starts the measurement; then every >= 2 s.
        ({"every_n_steps": None, "every_n_secs": 2.0}, 0.5, [5, 9, 13, 17, 21, 25, 29], [2.0] * 7),
    ],
)
def test_writes_the_step_rate_on_schedule(clock, writer, schedule, advance_secs, steps, rates):
    hook = StepCounterHook(**schedule, summary_writer=writer, clock=clock)
    run_steps([hook], 30, clock=clock, advance_secs=advance_secs)
    assert writer.scalar_steps(TAG) == steps
    assert writer.scalar_values(TAG) == pytest.approx(rates)


def test_logs_the_step_the_rate_and_the_step_outputs_at_info(clock, writer, caplog):
    """TF's default progress line (issue 34 item 5): the step, the rate and the step's scalars;
    a non-scalar output is left out of the line (the summaries name it)."""
    caplog.set_level(logging.INFO, logger="hooks.step_counter")
    run_steps([StepCounterHook(every_n_steps=10, summary_writer=writer, clock=clock)], 12, clock=clock,
              advance_secs=0.1, step_fn=lambda: {"loss": torch.tensor(0.53125), "acc": 0.25, "v": torch.ones(3)})
    assert [r.getMessage() for r in caplog.records if r.name == "hooks.step_counter"] == [
        "step 11: 10 steps/sec, loss = 0.5312, acc = 0.25"]


def test_output_dir_writes_real_events_through_the_cache(clock, tmp_path):
    run_steps([StepCounterHook(every_n_steps=10, output_dir=str(tmp_path), clock=clock)], 30, clock=clock,
              advance_secs=0.5)
    SummaryWriterCache.get(str(tmp_path)).flush()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars(TAG)] == [(11, 2.0), (21, 2.0)]


def test_falls_back_to_the_session_writer(clock, writer):
    run_steps([StepCounterHook(every_n_steps=10, clock=clock)], 12, clock=clock, advance_secs=0.5,
              creator=SessionCreator(summary_writer=writer))
    assert writer.scalar_steps(TAG) == [11]


def test_without_any_writer_warns_once_and_still_logs(clock, caplog):
    caplog.set_level(logging.INFO)
    hook = StepCounterHook(every_n_steps=10, clock=clock)
    run_steps([hook], 22, clock=clock, advance_secs=0.5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "StepCounterHook writes no summaries" in warnings[0].getMessage()
    assert sum(": 2 steps/sec" in r.getMessage() for r in caplog.records) == 2


def test_explicit_writer_wins_over_output_dir(clock, writer, tmp_path):
    run_steps([StepCounterHook(every_n_steps=10, summary_writer=writer, output_dir=str(tmp_path), clock=clock)],
              12, clock=clock, advance_secs=0.5)
    assert writer.scalar_steps(TAG) == [11]
    assert not list(tmp_path.iterdir())


def test_recovery_restarts_the_measurement(clock, writer):
    def step():
        clock.advance(0.5)
        if session.global_step == 14 and not failed:
            failed.append(True)
            clock.advance(1000)  # time lost to the failure must not count as a slow step rate
            raise RecoverableError("flaky")
        return loss_step()

    failed: list = []
    hook = StepCounterHook(every_n_steps=10, summary_writer=writer, clock=clock)
    with MonitoredSession(hooks=[hook], clock=FakeClock()) as session:
        for _ in range(30):
            session.run(step)
    # 11 before the failure; after it the first step (15) restarts the count: 25.
    assert writer.scalar_steps(TAG) == [11, 25]
    assert writer.scalar_values(TAG) == pytest.approx([2.0, 2.0])


def test_warns_when_the_global_step_does_not_advance(caplog):
    hook = StepCounterHook(every_n_steps=10, summary_writer=InMemorySummaryWriter())
    context = SimpleNamespace(session=SimpleNamespace(global_step=7))
    for _ in range(8):
        hook.after_run(context, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 5  # the first few only
    assert "has not advanced: it is still 7" in warnings[0]


def test_does_not_warn_when_the_step_advances(clock, writer, caplog):
    run_steps([StepCounterHook(every_n_steps=1, summary_writer=writer, clock=clock)], 5, clock=clock,
              advance_secs=1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_non_chief_writes_no_events_and_does_not_warn(clock, tmp_path, caplog):
    run_steps([StepCounterHook(every_n_steps=10, output_dir=str(tmp_path), clock=clock)], 22, clock=clock,
              advance_secs=0.5, creator=SessionCreator(is_chief=False))
    assert not list(tmp_path.iterdir())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _rates_on_disk(logdir):
    events = EventAccumulator(str(logdir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(TAG)] if TAG in events.Tags()["scalars"] else []


def test_a_cached_writer_is_flushed_when_the_session_closes(clock, tmp_path):
    """Issue 22.1: the rate reached the cached writer but never the file (nobody flushed it)."""
    run_steps([StepCounterHook(every_n_steps=10, output_dir=str(tmp_path), clock=clock)], 30, clock=clock,
              advance_secs=0.5)
    assert _rates_on_disk(tmp_path) == [(11, 2.0), (21, 2.0)]  # read without flushing anything


def test_a_cached_writer_is_flushed_when_the_session_fails(clock, tmp_path):
    def step():
        clock.advance(0.5)
        if session.global_step == 15:
            raise ValueError("boom")
        return loss_step()

    with pytest.raises(ValueError, match="boom"):
        with MonitoredSession(hooks=[StepCounterHook(every_n_steps=10, output_dir=str(tmp_path), clock=clock)],
                              clock=clock) as session:
            for _ in range(30):
                session.run(step)
    assert _rates_on_disk(tmp_path) == [(11, 2.0)]


_EXIT_SCRIPT = """
import sys
from supervisor import MonitoredSession
from supervisor.summary import SummaryWriter, SummaryWriterCache
from hooks import StepCounterHook
d = sys.argv[1]
SummaryWriterCache.get(d).add_scalar("outside/cached", 1.5, step=3)   # never flushed, never closed
SummaryWriter(d + "/plain").add_scalar("outside/plain", 2.5, step=4)   # dropped, never closed
hook = StepCounterHook(every_n_steps=1, output_dir=d + "/hook")
session = MonitoredSession(hooks=[hook])
for _ in range(3):
    session.run(lambda: None)
sys.exit(0)  # the session is never closed: only the interpreter's exit can flush
"""


@pytest.mark.timeout(60)
def test_writers_are_flushed_at_interpreter_exit(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)], check=True, timeout=60, env=env)

    def scalars(logdir, tag):
        events = EventAccumulator(str(logdir))
        events.Reload()
        return [(e.step, e.value) for e in events.Scalars(tag)]

    assert scalars(tmp_path, "outside/cached") == [(3, 1.5)]
    assert scalars(tmp_path / "plain", "outside/plain") == [(4, 2.5)]
    assert [step for step, _ in scalars(tmp_path / "hook", TAG)] == [2, 3]
