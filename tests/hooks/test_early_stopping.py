"""Early stopping on eval metrics read from real TensorBoard event files (TF's table)."""
from __future__ import annotations

import pytest

import hooks
from hooks import make_early_stopping_hook, read_eval_metrics
from supervisor import SessionCreator
from supervisor.summary import SummaryWriter

from tests.hooks._helpers import run_steps

EVALS = {1000: {"loss": 0.8, "accuracy": 0.5}, 2000: {"loss": 0.7, "accuracy": 0.6},
         3000: {"loss": 0.4, "accuracy": 0.7}, 3500: {"loss": 0.41, "accuracy": 0.68}}


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "eval"
    with SummaryWriter(str(directory)) as writer:  # what the evaluator writes
        for step, metrics in EVALS.items():
            writer.add_scalars(metrics, step)
    return str(directory)


def test_read_eval_metrics(eval_dir):
    metrics = read_eval_metrics(eval_dir)
    assert list(metrics) == [1000, 2000, 3000, 3500]
    for step, values in EVALS.items():  # float32 in the event file
        assert metrics[step] == pytest.approx(values)


def test_read_eval_metrics_of_a_missing_dir_is_empty(tmp_path):
    assert read_eval_metrics(str(tmp_path / "nope")) == {}


@pytest.mark.parametrize(
    ("factory", "args", "kwargs", "stops"),
    [
        (hooks.stop_if_higher_hook, ("accuracy", 0.6), {}, True),
        (hooks.stop_if_higher_hook, ("accuracy", 0.8), {}, False),
        (hooks.stop_if_higher_hook, ("accuracy", 0.6), {"min_steps": 4000}, False),
        (hooks.stop_if_higher_hook, ("accuracy", 0.69), {"min_steps": 3500}, False),
        (hooks.stop_if_lower_hook, ("loss", 0.5), {}, True),
        (hooks.stop_if_lower_hook, ("loss", 0.3), {}, False),
        (hooks.stop_if_lower_hook, ("loss", 0.405), {"min_steps": 3001}, False),
        (hooks.stop_if_no_decrease_hook, ("loss", 500), {}, True),
        (hooks.stop_if_no_decrease_hook, ("loss", 1500), {}, False),
        (hooks.stop_if_no_increase_hook, ("accuracy", 500), {}, True),
        (hooks.stop_if_no_increase_hook, ("accuracy", 501), {}, False),
        # Only evals at steps >= min_steps count: from 3500 alone there is no history.
        (hooks.stop_if_no_decrease_hook, ("loss", 500), {"min_steps": 3500}, False),
    ],
)
def test_tf_table(eval_dir, factory, args, kwargs, stops):
    session = run_steps([factory(eval_dir, *args, **kwargs)], 3)
    assert session.global_step == (1 if stops else 3)


def test_estimator_with_eval_dir_or_eval_dir_keyword(eval_dir):
    class Estimator:
        def eval_dir(self):
            return eval_dir

    assert run_steps([hooks.stop_if_higher_hook(Estimator(), "accuracy", 0.6)], 3).global_step == 1
    hook = hooks.stop_if_higher_hook("ignored", "accuracy", 0.6, eval_dir=eval_dir)
    assert run_steps([hook], 3).global_step == 1


@pytest.mark.parametrize(
    ("schedule", "asked_after_steps"),
    [({"run_every_secs": None, "run_every_steps": 5}, [1, 6, 11]), ({"run_every_secs": 4}, [1, 5, 9])],
)
def test_asks_on_its_schedule_only(clock, schedule, asked_after_steps):
    ran, asked = [], []

    def step():
        ran.append(1)
        clock.advance(1.0)
        return {}

    def should_stop():
        asked.append(len(ran))
        return False

    run_steps([make_early_stopping_hook(None, should_stop, **schedule, clock=clock)], 12, step_fn=step)
    assert asked == asked_after_steps


def test_picks_up_evaluations_written_while_training(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    hook = hooks.stop_if_lower_hook(str(tmp_path), "loss", 0.5, run_every_secs=None, run_every_steps=2)

    def step():
        if len(steps) == 3:  # the evaluator reports a good loss during step 4
            writer.add_scalar("loss", 0.1, 3000)
            writer.flush()
        steps.append(1)
        return {}

    steps: list = []
    session = run_steps([hook], 20, step_fn=step)
    writer.close()
    assert session.global_step == 5  # checked at 1, 3, 5: found at 5


def test_only_the_chief_decides(eval_dir):
    hook = hooks.stop_if_higher_hook(eval_dir, "accuracy", 0.6)
    assert run_steps([hook], 3, creator=SessionCreator(is_chief=False)).global_step == 3


def test_unknown_metric_names_the_available_ones(eval_dir):
    with pytest.raises(KeyError) as error:
        run_steps([hooks.stop_if_higher_hook(eval_dir, "acc", 0.6)], 1)
    assert 'metric "acc"' in error.value.args[0]
    assert "at step 1000" in error.value.args[0] and "['accuracy', 'loss']" in error.value.args[0]


def test_read_eval_metrics_never_blocks_on_a_fifo_named_like_an_events_file(tmp_path, caplog):
    """A FIFO among the events files is skipped with a WARNING, not opened (TensorBoard's loader
    used to wait on it forever); the events file beside it is still read."""
    import os
    import threading

    eval_dir = tmp_path / "eval"
    with SummaryWriter(str(eval_dir)) as writer:
        writer.add_scalars({"loss": 0.5}, 10)
    fifo = str(eval_dir / "events.out.tfevents.9999999999.host.1.eval")
    os.mkfifo(fifo)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(result=read_eval_metrics(str(eval_dir))), daemon=True)
    thread.start()
    thread.join(20)
    blocked = thread.is_alive()
    if blocked:  # release the reader (open the FIFO's other end) so the test fails instead of hanging
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(20)
    assert not blocked, "read_eval_metrics blocked opening a FIFO"
    assert box["result"] == {10: {"loss": 0.5}}
    assert "not a regular file" in caplog.text
