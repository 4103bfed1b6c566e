"""FeedFnHook, FinalOpsHook and GlobalStepWaiterHook through a real MonitoredSession."""
from __future__ import annotations

import itertools

import pytest

from hooks import FeedFnHook, FinalOpsHook, GlobalStepWaiterHook
from supervisor import MonitoredSession, SessionCreator

from tests.hooks._helpers import RestoredAt, loss_step, run_steps


def test_feed_fn_feeds_every_step():
    counter = itertools.count()
    seen = []
    run_steps([FeedFnHook(lambda: {"lr": next(counter)})], 3, step_fn=lambda lr: seen.append(lr) or {})
    assert seen == [0, 1, 2]


def test_feed_fn_conflicting_with_a_caller_argument_runs_nothing():
    ran = []
    with MonitoredSession(hooks=[FeedFnHook(lambda: {"lr": 1})]) as session:
        with pytest.raises(RuntimeError, match="FeedFnHook feeds 'lr'"):
            session.run(lambda lr: ran.append(lr), lr=2)
    assert ran == []


def test_final_ops_values_at_a_clean_end():
    total = {"n": 0}

    def step():
        total["n"] += 1
        return {"loss": 0.25}

    hook = FinalOpsHook({"count": lambda: total["n"], "last_loss": "loss"})
    assert hook.final_ops_values is None
    run_steps([hook], 4, step_fn=step)
    assert hook.final_ops_values == {"count": 4, "last_loss": 0.25}


def test_final_ops_single_callable_and_not_on_error():
    hook = FinalOpsHook(lambda: 42)
    run_steps([hook], 1)
    assert hook.final_ops_values == 42
    failing = FinalOpsHook(lambda: 42)
    with pytest.raises(ZeroDivisionError):
        run_steps([failing], 1, step_fn=lambda: 1 / 0)
    assert failing.final_ops_values is None


def test_final_ops_stop_iteration_is_reraised_with_advice(caplog):
    def draws_a_batch():
        raise StopIteration

    with pytest.raises(StopIteration):
        with MonitoredSession(hooks=[FinalOpsHook(draws_a_batch)]) as session:
            session.run(loss_step)
    assert "never draw another batch" in caplog.text


def test_waiter_waits_for_step_fn_then_runs(clock):
    # The watched step (e.g. the chief's) advances one step per 0.5 s of the fake clock.
    start = clock.monotonic()
    hook = GlobalStepWaiterHook(10, step_fn=lambda: int((clock.monotonic() - start) * 2), poll_secs=0.5, clock=clock)
    run_steps([hook], 3)
    assert clock.monotonic() - start == 5.0  # waited exactly until step 10, then never again


@pytest.mark.parametrize("wait_until_step", [0, -5, 3])
def test_waiter_does_not_wait_when_already_there(clock, wait_until_step):
    hook = GlobalStepWaiterHook(wait_until_step, clock=clock)
    run_steps([hook], 2, creator=RestoredAt(3))
    assert clock.monotonic() == 1_000_000.0


def test_waiter_reads_the_newest_checkpoint_step_from_the_logdir(clock, tmp_path):
    index = tmp_path / "checkpoint"
    index.write_text('model_checkpoint_path: "model.ckpt-100"\n')
    polls = []

    def sleep(secs):  # between two polls the chief commits a newer checkpoint
        polls.append(secs)
        index.write_text(f'model_checkpoint_path: "model.ckpt-{100 + 500 * len(polls)}"\n')

    clock.sleep = sleep
    hook = GlobalStepWaiterHook(1000, poll_secs=1.0, clock=clock)
    session = run_steps([hook], 1, creator=SessionCreator(logdir=str(tmp_path)))
    assert polls == [1.0, 1.0]  # saw 100, 600, then 1100 >= 1000
    assert session.global_step == 1


def test_waiter_without_a_step_source_refuses_to_hang(clock):
    with pytest.raises(RuntimeError, match="would wait forever for step 10.*pass step_fn"):
        run_steps([GlobalStepWaiterHook(10, clock=clock)], 1)


def test_waiter_ends_when_the_session_is_asked_to_stop(clock):
    waits = []

    def sleep(secs):
        waits.append(secs)
        if len(waits) == 3:
            session.request_stop()

    clock.sleep = sleep
    hook = GlobalStepWaiterHook(10, step_fn=lambda: 0, clock=clock)
    with MonitoredSession(hooks=[hook]) as session:
        session.run(loss_step)
    assert waits == [0.5] * 3
