"""Experiment: the tf.contrib.learn façade, each argument with its documented meaning."""
from __future__ import annotations

import pytest

from supervisor import Hook
from supervisor.estimator import BestExporter, Experiment, LatestExporter, RunConfig
from supervisor.testing import FakeClock
from tests.estimator.estimator_toy import batches, endless, eval_scalars, make_estimator


def evaluated(est):
    return [s for s, _ in eval_scalars(est.eval_dir()).get("loss", [])]


def experiment(tmp_path, clock=None, config=None, **kwargs):
    est = make_estimator(tmp_path, clock=clock or FakeClock(), **({"config": config} if config else {}))
    kwargs.setdefault("eval_steps", None)
    return est, Experiment(est, endless(), lambda: batches(), **kwargs)


def test_train_and_evaluate_every_new_checkpoint_by_default(tmp_path):
    est, exp = experiment(tmp_path, train_steps=15, export_strategies=LatestExporter())
    metrics, exports = exp.train_and_evaluate()
    assert evaluated(est) == [5, 10, 15] and metrics["global_step"] == 15
    assert len(exports) == 1 and exports[0].startswith(str(tmp_path / "export" / "latest_exporter"))


def test_min_eval_frequency_in_steps(tmp_path):
    est, exp = experiment(tmp_path, train_steps=25, min_eval_frequency=10)
    exp.train_and_evaluate()
    assert evaluated(est) == [10, 20, 25]  # checkpoints every 5 steps, evaluations >= 10 apart, final


def test_min_eval_frequency_zero_evaluates_after_training_only(tmp_path):
    est, exp = experiment(tmp_path, train_steps=15, min_eval_frequency=0)
    metrics, _ = exp.train_and_evaluate()
    assert evaluated(est) == [15] and metrics["global_step"] == 15


def test_continuous_train_and_eval_alternates(tmp_path):
    est, exp = experiment(tmp_path, train_steps=20, train_steps_per_iteration=7,
                          export_strategies=[BestExporter()])
    metrics, exports = exp.continuous_train_and_eval()
    assert evaluated(est) == [7, 14, 20]
    assert metrics["global_step"] == 20 and len(exports) == 1


def test_continuous_train_and_eval_predicate_stops(tmp_path):
    est, exp = experiment(tmp_path, train_steps=100, train_steps_per_iteration=4)
    seen = []

    def predicate(eval_result):
        seen.append(None if eval_result is None else eval_result["global_step"])
        return eval_result is None or eval_result["global_step"] < 8

    metrics, _ = exp.continuous_train_and_eval(continuous_eval_predicate_fn=predicate)
    assert seen == [None, 4, 8] and evaluated(est) == [4, 8] and metrics["global_step"] == 8


def test_default_steps_per_iteration(tmp_path):
    _, exp = experiment(tmp_path, train_steps=50)
    assert exp._steps_per_iteration() == 5
    _, exp = experiment(tmp_path)
    assert exp._steps_per_iteration() == 1000


def test_train_and_evaluate_with_eval_delay(tmp_path):
    clock = FakeClock()
    est, exp = experiment(tmp_path, clock=clock, train_steps=5, eval_delay_secs=30)
    exp.train()
    assert est.checkpoint_step() == 5
    start = clock.monotonic()
    assert exp.evaluate()["global_step"] == 5
    assert clock.monotonic() - start == pytest.approx(30)
    assert exp.evaluate(delay_secs=0, name="now")["global_step"] == 5
    assert clock.monotonic() - start == pytest.approx(30)


def test_continuous_eval_ends_at_train_steps_and_when_the_run_is_finished(tmp_path):
    est, exp = experiment(tmp_path, train_steps=10, eval_delay_secs=0, continuous_eval_throttle_secs=0)
    exp.train()  # a clean end: the run is marked finished
    assert exp.continuous_eval()["global_step"] == 10  # the checkpoint at train_steps ends it
    est2, exp2 = experiment(tmp_path / "two", eval_delay_secs=0, continuous_eval_throttle_secs=0)  # no train_steps
    est2.train(endless(), max_steps=5)
    assert exp2.continuous_eval()["global_step"] == 5
    assert exp2.continuous_eval(continuous_eval_predicate_fn=lambda r: False) is None


class SeeHooks(Hook):
    classes: list = []

    def after_create_session(self, session, coord):
        SeeHooks.classes = [type(h).__name__ for h in session.hooks]


def test_worker_delays(tmp_path):
    clock = FakeClock()
    config = RunConfig(tmp_path, save_checkpoints_steps=5, task_type="worker", task_id=2)
    _, exp = experiment(tmp_path, clock=clock, config=config, train_steps=1, train_hooks=[SeeHooks()])
    delays = []
    exp._sleep = lambda secs, what: delays.append(secs)
    exp.estimator.train = lambda *a, **k: k["hooks"]
    exp.train()
    assert delays == [10]  # min(60, 5 * task_id)
    _, by_step = experiment(tmp_path, clock=clock, config=config, train_steps=1, delay_workers_by_global_step=True)
    by_step.estimator.train = lambda *a, **k: k["hooks"]
    (waiter,) = by_step.train()
    assert type(waiter).__name__ == "GlobalStepWaiterHook" and waiter._wait_until_step == 8788  # 8000*log1p(2)


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(train_steps=0), ValueError, "train_steps must be a positive integer or None"),
    (dict(eval_steps=-1), ValueError, "eval_steps must be a positive integer or None"),
    (dict(eval_delay_secs=-1), ValueError, "eval_delay_secs must be a non-negative number"),
    (dict(continuous_eval_throttle_secs="x"), TypeError, "continuous_eval_throttle_secs"),
    (dict(min_eval_frequency=-1), ValueError, "min_eval_frequency must be a non-negative integer"),
    (dict(delay_workers_by_global_step=1), TypeError, "delay_workers_by_global_step must be True or False"),
    (dict(export_strategies=[object()]), TypeError, "`exporters` must be an Exporter"),
    (dict(train_steps_per_iteration=0), ValueError, "train_steps_per_iteration must be a positive integer"),
    (dict(train_hooks=[1]), TypeError, "All hooks must be"),
])
def test_argument_errors(tmp_path, kwargs, error, fragment):
    est = make_estimator(tmp_path)
    with pytest.raises(error, match=fragment):
        Experiment(est, endless(), lambda: batches(), **kwargs)
    with pytest.raises(TypeError, match="`estimator` must have type"):
        Experiment(object(), endless(), lambda: batches())
    with pytest.raises(TypeError, match="`input_fn` must be callable"):
        Experiment(est, endless(), None)


def test_continuous_eval_predicate_ends_after_the_evaluation_it_rejects(tmp_path):
    est, exp = experiment(tmp_path, train_steps=100, eval_delay_secs=0, continuous_eval_throttle_secs=0)
    est.train(endless(), max_steps=5)
    seen = []
    last = exp.continuous_eval(continuous_eval_predicate_fn=lambda r: seen.append(r) or r is None)
    assert last["global_step"] == 5 and seen[0] is None and seen[1]["global_step"] == 5 and len(seen) == 2
