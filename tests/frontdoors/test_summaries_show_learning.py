"""Summaries that always show learning (SPEC §6, §9; issue 10 item 1): a final summary at a
clean close, no ``global_step/sec`` point before a rate is measurable, non-scalars named."""
from __future__ import annotations

import glob
import logging
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from supervisor import Supervisor
from supervisor.testing import FakeClock


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(model, opt):
    x = torch.ones(4, 3)

    def step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach(), "accuracy": torch.tensor(0.5), "vector": torch.ones(3), "name": "run-1"}

    return step


def _scalars(logdir, tag):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def _raw_scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            for value in event.summary.value:
                if value.tag == tag:
                    found.append((event.step, value.simple_value or float(value.tensor.float_val[0])))
    return found


def test_a_run_shorter_than_the_interval_still_writes_its_last_values(tmp_path):
    clock = FakeClock()
    model, opt = _model()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=120, clock=clock,
                    summary_fn=lambda s: {"custom": float(s.global_step)})
    with sv.managed_session() as s:
        clock.wait_for_waiters(3)  # the services' first ticks (step 0: no output yet)
        train = _train(model, opt)
        for _ in range(5):
            s.run(train)
        clock.advance(2.5)
    assert [step for step, _ in _scalars(tmp_path, "loss")] == [5]
    assert _scalars(tmp_path, "accuracy") == [(5, 0.5)]
    assert _scalars(tmp_path, "custom") == [(0, 0.0), (5, 5.0)]
    assert _scalars(tmp_path, "global_step/sec") == [(5, 2.0)]  # 5 steps in 2.5 s, measured at close


def test_no_final_summary_when_the_step_did_not_advance(tmp_path):
    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=10, clock=clock).managed_session() as s:
        clock.wait_for_waiters(3)
        train = _train(model, opt)
        for _ in range(4):
            s.run(train)
        clock.advance(10)
        clock.wait_for_waiters(3)  # the tick wrote step 4
    assert [step for step, _ in _scalars(tmp_path, "loss")] == [4]
    assert _scalars(tmp_path, "global_step/sec") == [(4, pytest.approx(0.4))]


def test_a_resumed_session_draws_no_zero_rate_at_its_start(tmp_path):
    model, opt = _model()
    for round_ in range(2):
        clock = FakeClock()
        with Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=10,
                        clock=clock).managed_session() as s:
            clock.wait_for_waiters(3)
            train = _train(model, opt)
            for _ in range(10):
                s.run(train)
            clock.advance(10)
            clock.wait_for_waiters(3)
    # Every point ever written, in both events files, and what TensorBoard shows: the same
    # (the second session's START is at step 11, so the first run's last point stays).
    assert _raw_scalars(tmp_path, "global_step/sec") == [(10, 1.0), (20, 1.0)]
    assert _scalars(tmp_path, "global_step/sec") == [(10, 1.0), (20, 1.0)]


def _session_logs(logdir):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [(event.session_log.status, event.step)
            for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
            for event in EventFileLoader(path).Load() if event.HasField("session_log")]


def test_a_resumed_curve_keeps_the_last_point_before_it_and_hides_a_crashed_runs_extra_points(tmp_path):
    from tensorboard.compat.proto.event_pb2 import SessionLog

    from supervisor.summary import SummaryWriter

    model, opt = _model()
    for round_ in range(2):
        clock = FakeClock()
        with Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=60, clock=clock,
                        summary_fn=lambda s: {"custom": float(s.global_step)}).managed_session() as s:
            clock.wait_for_waiters(3)  # the first ticks: step 0, then the restored step 10
            train = _train(model, opt)
            for _ in range(10):
                s.run(train)
        # The first session closed at step 10 with its final checkpoint and final summary. As if
        # a later run had crashed before its next checkpoint: points beyond step 10 on disk.
        if round_ == 0:
            with SummaryWriter(str(tmp_path)) as stale:
                stale.add_scalar("loss", 99.0, 13)
                stale.add_scalar("custom", 99.0, 13)
    assert [step for step, _ in _raw_scalars(tmp_path, "loss")] == [10, 13, 20]
    # TensorBoard's view: the crashed run's step 13 is gone, step 10 (the state resumed from)
    # stays, and the resumed session wrote nothing at step 10 again (one point per step).
    assert [step for step, _ in _scalars(tmp_path, "loss")] == [10, 20]
    assert _scalars(tmp_path, "custom") == [(0, 0.0), (10, 10.0), (20, 20.0)]
    starts = [step for status, step in _session_logs(tmp_path) if status == SessionLog.START]
    assert starts == [1, 11]  # each session's first step


def test_non_scalar_outputs_are_named_once(tmp_path, caplog):
    clock = FakeClock()
    model, opt = _model()
    with caplog.at_level(logging.WARNING):
        with Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=10,
                        clock=clock).managed_session() as s:
            clock.wait_for_waiters(3)
            train = _train(model, opt)
            for _ in range(3):
                for _ in range(2):
                    s.run(train)
                clock.advance(10)
                clock.wait_for_waiters(3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert any("'vector' is a Tensor of shape (3,)" in w for w in warnings)
    assert any("'name' is a str" in w for w in warnings)
    assert all("not written to TensorBoard" in w and "Supervisor" in w for w in warnings)


def test_the_last_step_rate_ends_at_the_stopping_boundary_not_at_close(tmp_path):
    """The final ``global_step/sec`` point is training time only: a slow close (the final
    checkpoint's commit, the rest of the ``with`` block) drew a dip at every run's end."""
    from hooks import StopAtStepHook

    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=60, clock=clock,
                    hooks=[StopAtStepHook(last_step=5)]).managed_session() as s:
        # All three services waiting (checkpoint, summaries, step counter): the step counter's
        # first tick started the measurement at step 0, t = 0 (with 2, it could still be due).
        clock.wait_for_waiters(3)
        train = _train(model, opt)
        while not s.should_stop():
            clock.advance(0.5)  # each step takes 0.5 s: the stop comes at step 5, t = 2.5
            s.run(train)
        clock.advance(100)  # then the loop's own epilogue, and the close, take long
    assert _scalars(tmp_path, "global_step/sec") == [(5, 2.0)]


def _tick(clock, secs):
    clock.advance(secs)
    clock.wait_for_waiters(2)  # both summary services ran this tick and wait for the next


def test_the_step_rate_has_one_point_per_step_and_a_stall_shows_once_as_zero(tmp_path):
    """Issue 22.2 / SPEC §9: a tick that sees no new step writes no second point at that step;
    a whole interval without progress is a stall: one 0.0, at the stalled step (the one in
    progress), however long it lasts; the step that ends it draws no second point there."""
    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=10,
                    clock=clock).managed_session() as s:
        clock.wait_for_waiters(2)  # the first ticks: the measurement starts at step 0
        train = _train(model, opt)
        for _ in range(20):
            s.run(train)
        _tick(clock, 10)  # 20 steps in 10 s
        _tick(clock, 10)  # no step in a whole interval: step 21 stalls
        _tick(clock, 10)  # still stalled: no second 0.0
        s.run(train)
        _tick(clock, 10)  # step 21 done: it already has its point
        for _ in range(10):
            s.run(train)
        _tick(clock, 10)  # 10 steps since step 21's tick, in 10 s
    rate = _raw_scalars(tmp_path, "global_step/sec")
    assert rate == [(20, 2.0), (21, 0.0), (31, 1.0)]


def test_no_zero_rate_without_a_stall_when_every_interval_makes_progress(tmp_path):
    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=10,
                    clock=clock).managed_session() as s:
        clock.wait_for_waiters(2)
        train = _train(model, opt)
        for steps in (3, 1, 5, 2):
            for _ in range(steps):
                s.run(train)
            _tick(clock, 10)
    assert _raw_scalars(tmp_path, "global_step/sec") == [(3, pytest.approx(0.3)), (4, pytest.approx(0.1)),
                                                               (9, 0.5), (11, pytest.approx(0.2))]


def test_a_step_a_little_slower_than_the_interval_is_not_a_stall(tmp_path):
    """A tick that falls between two slow steps is no stall: that needs ten steps' time at the
    last rate (and a whole interval) without a step (SPEC §9: no 0.0 for "no tick between")."""
    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=10,
                    clock=clock).managed_session() as s:
        clock.wait_for_waiters(2)
        train = _train(model, opt)
        s.run(train)
        _tick(clock, 10)  # step 1: 0.1 steps/s
        _tick(clock, 10)  # the next step is still running: 10 s < ten steps' time (100 s)
        s.run(train)
        _tick(clock, 10)  # step 2, 20 s after step 1's point
        _tick(clock, 200)  # 200 s without a step, over ten steps at the mean rate (150 s): a stall
    assert _raw_scalars(tmp_path, "global_step/sec") == [(1, pytest.approx(0.1)), (2, pytest.approx(0.05)),
                                                         (3, 0.0)]


def test_a_scheduler_pause_on_a_busy_machine_is_not_a_stall(tmp_path):
    """The quickstart (0.1 s interval, ~17 steps/s) drew five 0.0 points in a first run on a
    loaded 2-core machine: pauses of 0.6-0.8 s, over ten steps' time, with no step. A stall
    needs at least 2 s without a step too; a longer one is still drawn once."""
    clock = FakeClock()
    model, opt = _model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=0.1,
                    clock=clock).managed_session() as s:
        clock.wait_for_waiters(2)
        train = _train(model, opt)
        for _ in range(3):
            for _ in range(10):
                s.run(train)
            _tick(clock, 0.1)  # 100 steps/s: ten steps' time is 0.1 s
        for _ in range(8):
            _tick(clock, 0.1)  # a 0.8 s pause: the machine was busy, training was not stalled
        for _ in range(10):
            s.run(train)
        _tick(clock, 0.1)
        for _ in range(25):
            _tick(clock, 0.1)  # 2.5 s without a step: a stall, drawn once at the stalled step
    rate = _raw_scalars(tmp_path, "global_step/sec")
    assert [step for step, value in rate if value == 0.0] == [41], rate
