"""ProgressBarHook: a tqdm bar when tqdm is importable, INFO lines otherwise."""
from __future__ import annotations

import io
import logging

import pytest

import hooks.progress
from hooks import ProgressBarHook, StopAtStepHook

from tests.hooks._helpers import RestoredAt, run_steps


def bar_text(stream):
    return stream.getvalue().replace("\r", "\n")


def test_tqdm_bar_counts_steps_and_takes_the_total_from_stop_at_step():
    stream = io.StringIO()
    hook = ProgressBarHook(fetches=["loss"], every_n_steps=5, tqdm_kwargs={"file": stream, "mininterval": 0})
    assert hook.uses_tqdm
    run_steps([hook, StopAtStepHook(num_steps=20)], 100, creator=RestoredAt(10))
    text = bar_text(stream)
    assert "30/30" in text  # restored at 10, 20 more steps: the bar starts at 10 of 30
    assert "loss = 0.5" in text


def test_log_lines_without_tqdm(clock, caplog, monkeypatch):
    monkeypatch.setattr(hooks.progress, "_tqdm", None)
    caplog.set_level(logging.INFO, logger="hooks.progress")
    hook = ProgressBarHook(total_steps=40, every_n_steps=10, fetches="loss", clock=clock)
    assert not hook.uses_tqdm
    run_steps([hook], 21, clock=clock, advance_secs=0.5)
    assert [r.getMessage() for r in caplog.records] == [
        "train: step 1/40 (2%), loss = 0.5",
        "train: step 11/40 (28%), 2 steps/sec, eta 0:00:14, loss = 0.5",
        "train: step 21/40 (52%), 2 steps/sec, eta 0:00:10, loss = 0.5",
    ]


def test_log_lines_by_default_every_10_secs_without_total(clock, caplog):
    caplog.set_level(logging.INFO, logger="hooks.progress")
    run_steps([ProgressBarHook(use_tqdm=False, clock=clock)], 25, clock=clock, advance_secs=1.0)
    assert [r.getMessage() for r in caplog.records] == [
        "train: step 1", "train: step 12, 1 steps/sec", "train: step 23, 1 steps/sec"]


def test_use_tqdm_true_without_tqdm_says_how_to_fix(monkeypatch):
    monkeypatch.setattr(hooks.progress, "_tqdm", None)
    with pytest.raises(ValueError, match="pip install tqdm"):
        ProgressBarHook(use_tqdm=True)


def test_the_bar_is_closed_on_an_error():
    stream = io.StringIO()
    hook = ProgressBarHook(tqdm_kwargs={"file": stream})
    with pytest.raises(ZeroDivisionError):
        run_steps([hook], 3, step_fn=lambda: 1 / 0 if hook._bar is not None else {})
    assert hook._bar is None


def test_the_bar_goes_back_with_the_step_after_a_recovery():
    from supervisor import MonitoredSession, RecoverableError, Restored, SessionCreator
    from supervisor.testing import FakeClock

    class RestoresStep1OnRecreation(SessionCreator):
        creations = 0

        def restore(self, session):
            self.creations += 1
            return Restored(1, "model.ckpt-1") if self.creations > 1 else None

    failures = [RecoverableError("flaky")]

    def step():
        if session.global_step == 3 and failures:
            raise failures.pop()
        return {}

    hook = ProgressBarHook(tqdm_kwargs={"file": io.StringIO()})
    positions = []
    with MonitoredSession(RestoresStep1OnRecreation(), hooks=[hook], clock=FakeClock()) as session:
        for _ in range(5):
            session.run(step)
            positions.append(hook._bar.n)
    # The 4th run fails at step 3 and is retried from the checkpoint of step 1.
    assert positions == [1, 2, 3, 2, 3]
