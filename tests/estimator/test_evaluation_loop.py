"""The continuous-evaluation loop: which checkpoints, when, and when it stops (SPEC §10.2, §10.4)."""
from __future__ import annotations

import logging
import os
import shutil
import threading

import pytest

import supervisor.estimator.evaluation as evaluation
from supervisor.checkpoint.layout.finished import mark_finished
from supervisor.estimator.evaluation import EvaluationLoop, StopReason

from tests.estimator.sidecar_helpers import ScriptedClock, StepTrainer, weight_of


@pytest.fixture
def trainer(tmp_path):
    t = StepTrainer(str(tmp_path / "run"))
    yield t
    t.close()


def mean_weight(ckpt) -> float:
    return float(ckpt.payload["model"]["0.weight"].mean())


def loop(trainer, clock, evaluate=mean_weight, **kwargs) -> EvaluationLoop:
    kwargs.setdefault("poll_secs", 1.0)
    return EvaluationLoop(trainer.directory, evaluate, clock=clock, **kwargs)


def test_started_before_any_checkpoint_waits_then_evaluates(trainer):
    clock = ScriptedClock()
    start = clock.time()
    clock.at(30, lambda: trainer.save(7))
    ev = loop(trainer, clock, max_evaluations=1)
    results = ev.run()
    assert [(r.step, r.metrics) for r in results] == [(7, pytest.approx(weight_of(7)))]
    assert clock.time() - start == pytest.approx(30, abs=1.0)
    assert ev.stop_reason == StopReason.MAX_EVALUATIONS


def test_timeout_without_timeout_fn_ends_the_loop(trainer):
    clock = ScriptedClock()
    start = clock.time()
    ev = loop(trainer, clock, timeout=10)
    assert ev.run() == []
    assert ev.stop_reason == StopReason.TIMEOUT
    assert clock.time() - start == pytest.approx(10)


def test_timeout_fn_false_keeps_waiting_true_ends(trainer):
    """TF: at each timeout, timeout_fn() decides; False → wait for another timeout period."""
    clock = ScriptedClock()
    start = clock.time()
    answers = iter([False, False, True])
    calls = []

    def timeout_fn():
        calls.append(clock.time() - start)
        return next(answers)

    clock.at(12, lambda: trainer.save(1))  # arrives during the third timeout period
    ev = loop(trainer, clock, timeout=5, timeout_fn=timeout_fn)
    results = ev.run()
    assert [r.step for r in results] == [1]
    # Timeouts at 5 and 10 (False, False); the checkpoint at 12; then one more period with
    # nothing new: 13 + 5 = 18 (the period restarts after the evaluation), timeout_fn → True.
    assert calls == [pytest.approx(5), pytest.approx(10), pytest.approx(18, abs=1.0)]
    assert ev.stop_reason == StopReason.TIMEOUT


def test_min_interval_secs_spaces_evaluation_starts(trainer):
    clock = ScriptedClock()
    for i in range(1, 40):
        clock.at(i, lambda i=i: trainer.save(i))
    ev = loop(trainer, clock, min_interval_secs=10, max_evaluations=3, poll_secs=0.5)
    starts = [r.started_wall_time for r in ev.run()]
    assert len(starts) == 3
    assert all(b - a >= 10 for a, b in zip(starts, starts[1:]))


def test_throttle_secs_is_the_same_rule_and_the_larger_wins(trainer):
    clock = ScriptedClock()
    for i in range(1, 80):
        clock.at(i, lambda i=i: trainer.save(i))
    ev = loop(trainer, clock, min_interval_secs=5, throttle_secs=20, max_evaluations=3, poll_secs=0.5)
    starts = [r.started_wall_time for r in ev.run()]
    assert all(b - a >= 20 for a, b in zip(starts, starts[1:]))


def test_checkpoints_superseded_while_busy_are_skipped(trainer):
    """Always the newest: steps committed during an evaluation except the last are never read."""
    trainer.save(1)
    seen = []

    def evaluate(ckpt):
        seen.append(ckpt.step)
        if ckpt.step == 1:
            trainer.save(2)
            trainer.save(3)
        return mean_weight(ckpt)

    ev = loop(trainer, ScriptedClock(), evaluate, timeout=3)
    assert [r.step for r in ev.run()] == [1, 3]
    assert seen == [1, 3]
    assert ev.stats.evaluated == 2


def test_start_delay_secs_waits_before_the_first_look(trainer):
    trainer.save(1)
    clock = ScriptedClock()
    start = clock.time()
    ev = loop(trainer, clock, start_delay_secs=120, max_evaluations=1)
    results = ev.run()
    assert results[0].started_wall_time - start == pytest.approx(120)


def test_stops_at_max_steps_after_evaluating_it(trainer):
    clock = ScriptedClock()
    for i in range(1, 20):
        clock.at(i * 2, lambda i=i: trainer.save(i))
    ev = loop(trainer, clock, max_steps=5, poll_secs=0.5)
    steps = [r.step for r in ev.run()]
    assert steps[-1] == 5 and steps == sorted(steps)
    assert ev.stop_reason == StopReason.MAX_STEPS


def test_finished_mark_ends_the_loop_after_the_final_checkpoint(trainer):
    """The trainer commits its final checkpoint and marks the run finished while the evaluator
    is busy: the final checkpoint is evaluated, then the loop ends (no max_steps, no timeout)."""
    trainer.save(1)

    def evaluate(ckpt):
        if ckpt.step == 1:
            trainer.save(2)
            mark_finished(trainer.directory, step=2)
        return mean_weight(ckpt)

    ev = loop(trainer, ScriptedClock(), evaluate)
    assert [r.step for r in ev.run()] == [1, 2]
    assert ev.stop_reason == StopReason.FINISHED


def test_finished_run_already_evaluated_ends_at_once(trainer):
    trainer.save(4)
    mark_finished(trainer.directory, step=4)
    clock = ScriptedClock()
    start = clock.time()
    ev = loop(trainer, clock, lambda c: pytest.fail("step 4 was evaluated already"), skip_step=lambda s: s == 4)
    assert ev.run() == []
    assert ev.stop_reason == StopReason.FINISHED
    assert ev.stats.skipped == 1
    assert clock.time() == start


@pytest.mark.parametrize("damage, reason", [("bitflip", "checksum"), ("truncate", "truncated")])
def test_damaged_checkpoint_is_skipped_with_a_warning(trainer, caplog, damage, reason):
    path = trainer.save(1)
    state_file = os.path.join(path, "state.pt")
    with open(state_file, "r+b") as f:
        if damage == "bitflip":
            f.seek(os.path.getsize(state_file) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        else:
            f.truncate(os.path.getsize(state_file) - 100)
    clock = ScriptedClock()
    clock.at(5, lambda: trainer.save(2))
    ev = loop(trainer, clock, timeout=20)
    with caplog.at_level(logging.WARNING, logger="supervisor.estimator.evaluation"):
        results = ev.run()
    assert [r.step for r in results] == [2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "model.ckpt-1" in warnings[0].getMessage()
    assert reason in warnings[0].getMessage()
    assert ev.stats.corrupt == 1


def test_checkpoint_deleted_between_listing_and_opening_is_skipped_with_info(trainer, caplog, monkeypatch):
    trainer.save(1)
    real = evaluation.latest_checkpoint
    deleted = []

    def listing_then_retention(directory, **storage):
        path = real(directory, **storage)
        if path is not None and not deleted:  # retention strikes right after the listing
            shutil.rmtree(path)
            deleted.append(path)
        return path

    monkeypatch.setattr(evaluation, "latest_checkpoint", listing_then_retention)
    clock = ScriptedClock()
    clock.at(3, lambda: trainer.save(2))
    ev = loop(trainer, clock, timeout=10)
    with caplog.at_level(logging.INFO, logger="supervisor.estimator.evaluation"):
        results = ev.run()
    assert [r.step for r in results] == [2]
    assert ev.stats.vanished == 1
    notes = [r for r in caplog.records if "model.ckpt-1" in r.getMessage() and "deleted" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_skip_step_is_not_evaluated_and_counted(trainer):
    trainer.save(3)
    clock = ScriptedClock()
    clock.at(2, lambda: trainer.save(4))
    ev = loop(trainer, clock, skip_step=lambda s: s == 3, max_evaluations=1)
    assert [r.step for r in ev.run()] == [4]
    assert ev.stats.skipped == 1


def test_an_error_in_evaluate_fn_is_raised_not_retried(trainer):
    trainer.save(1)
    calls = []

    def evaluate(ckpt):
        calls.append(ckpt.step)
        raise ZeroDivisionError("bug in the metric")

    with pytest.raises(ZeroDivisionError):
        loop(trainer, ScriptedClock(), evaluate).run()
    assert calls == [1]


def test_stop_from_another_thread_ends_the_wait(trainer):
    ev = EvaluationLoop(trainer.directory, mean_weight, poll_secs=0.01)
    thread = threading.Thread(target=ev.run)
    thread.start()
    ev.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert ev.stop_reason == StopReason.STOPPED


def test_iterating_yields_each_result_as_it_happens(trainer):
    trainer.save(1)
    clock = ScriptedClock()
    clock.at(2, lambda: trainer.save(2))
    ev = loop(trainer, clock, timeout=5)
    it = iter(ev)
    first = next(it)
    assert first.step == 1 and ev.stats.evaluated == 1  # step 2 not committed yet
    assert [r.step for r in it] == [2]


@pytest.mark.parametrize("kwargs, match", [
    ({"max_evaluations": 0}, "max_evaluations must be a positive integer or None, got 0"),
    ({"min_interval_secs": -1}, "min_interval_secs must be a non-negative number, got -1"),
    ({"timeout": -5}, "timeout must be a non-negative number or None, got -5"),
    ({"poll_secs": 0}, "poll_secs must be a positive number, got 0"),
    ({"verify": "crc"}, "verify must be one of 'full', 'size', got 'crc'"),
])
def test_bad_arguments_name_the_argument_and_value(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EvaluationLoop(str(tmp_path), mean_weight, **kwargs)


def test_bad_callables_are_type_errors(tmp_path):
    with pytest.raises(TypeError, match="evaluate_fn must be a callable"):
        EvaluationLoop(str(tmp_path), None)
    with pytest.raises(TypeError, match="timeout_fn must be a callable"):
        EvaluationLoop(str(tmp_path), mean_weight, timeout_fn=True)


def test_a_final_checkpoint_committed_between_the_look_and_the_mark_is_still_evaluated(trainer, monkeypatch):
    """The trainer publishes its final checkpoint and writes the mark right after the loop's look
    at the index: the loop looks again once it sees the mark, so the final one is evaluated."""
    trainer.save(1)
    real = evaluation.read_finished
    calls = []

    def trainer_finishes_just_now(directory, **storage):
        if not calls:
            trainer.save(2)
            mark_finished(trainer.directory, step=2)
        calls.append(directory)
        return real(directory, **storage)

    monkeypatch.setattr(evaluation, "read_finished", trainer_finishes_just_now)
    ev = loop(trainer, ScriptedClock(), skip_step=lambda s: s == 1)
    assert [r.step for r in ev.run()] == [2]
    assert ev.stop_reason == StopReason.FINISHED


def test_the_loops_memory_of_seen_checkpoints_is_bounded():
    recent = evaluation._Recent(capacity=3)
    for item in range(5):
        recent.add(item)
    assert [i in recent for i in range(5)] == [False, False, True, True, True]
    recent.add(2)  # re-adding refreshes it
    recent.add(5)
    assert 2 in recent and 3 not in recent
