"""LoggingTensorHook: TF's message format, local iteration counting, at_end, formatter."""
from __future__ import annotations

import logging

import pytest
import torch

from hooks import LoggingTensorHook

from tests.hooks._helpers import RestoredAt, run_steps

LOGGER = "hooks.logging_hook"


def step_outputs():
    return {"loss": torch.tensor(0.53), "step": torch.tensor(101), "lr": 0.001}


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.fixture(autouse=True)
def _info(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)


def test_tf_message_format(clock, caplog):
    hook = LoggingTensorHook({"step": "step", "loss": "loss"}, every_n_iter=10, clock=clock)
    run_steps([hook], 11, step_fn=step_outputs, clock=clock, advance_secs=0.1234)
    assert messages(caplog) == ["loss = 0.53, step = 101", "loss = 0.53, step = 101 (1.234 sec)"]


@pytest.mark.parametrize(
    ("every_n_iter", "runs", "logged_iterations"),
    [(10, 25, [1, 11, 21]), (1, 3, [1, 2, 3]), (7, 7, [1])],
)
def test_logs_the_first_iteration_then_every_nth(clock, caplog, every_n_iter, runs, logged_iterations):
    iteration = []

    def step():
        iteration.append(len(iteration) + 1)
        return {"loss": torch.tensor(float(len(iteration)))}

    run_steps([LoggingTensorHook(["loss"], every_n_iter=every_n_iter, clock=clock)], runs, step_fn=step)
    assert messages(caplog) == [f"loss = {i}.0" + ("" if n == 0 else " (0.000 sec)")
                                for n, i in enumerate(logged_iterations)]


def test_counts_local_iterations_not_the_global_step(caplog):
    # Restored at step 95: a global-step schedule would log at 100; TF counts this process's runs.
    hook = LoggingTensorHook(["loss"], every_n_iter=10)
    run_steps([hook], 12, creator=RestoredAt(95))
    assert len(messages(caplog)) == 2  # runs 1 and 11


def test_list_keeps_the_given_order_dict_sorts_tags(caplog):
    run_steps([LoggingTensorHook(["step", "lr", "loss"], every_n_iter=5)], 1, step_fn=step_outputs)
    run_steps([LoggingTensorHook({"b": "loss", "a": "lr"}, every_n_iter=5)], 1, step_fn=step_outputs)
    assert messages(caplog) == ["step = 101, lr = 0.001, loss = 0.53", "a = 0.001, b = 0.53"]


def test_every_n_secs(clock, caplog):
    hook = LoggingTensorHook(["loss"], every_n_secs=3.0, clock=clock)
    run_steps([hook], 10, clock=clock, advance_secs=1.0)
    # Iterations 1 (t=1), then the first one starting >= 3 s later: 5 (t=5), 9 (t=9).
    assert messages(caplog) == ["loss = 0.5", "loss = 0.5 (4.000 sec)", "loss = 0.5 (4.000 sec)"]


def test_at_end_only_logs_the_last_values(caplog):
    counter = iter(range(1, 100))
    run_steps([LoggingTensorHook(["loss"], at_end=True)], 4, step_fn=lambda: {"loss": next(counter)})
    assert messages(caplog) == ["loss = 4"]


def test_at_end_with_a_schedule_logs_both(caplog):
    run_steps([LoggingTensorHook(["loss"], every_n_iter=10, at_end=True)], 3)
    assert len(messages(caplog)) == 2


def test_formatter_gets_the_raw_values(caplog):
    hook = LoggingTensorHook(["loss", "step"], every_n_iter=1,
                             formatter=lambda v: f"loss={v['loss']:.1f} at {int(v['step'])}")
    run_steps([hook], 1, step_fn=step_outputs)
    assert messages(caplog) == ["loss=0.5 at 101"]


def test_callables_and_non_scalar_tensors(caplog):
    hook = LoggingTensorHook({"w": lambda: torch.tensor([1.0, 2.5])}, every_n_iter=1)
    run_steps([hook], 1)
    assert messages(caplog) == ["w = [1.  2.5]"]
