"""The trainer's "run finished" mark (supervisor.checkpoint.layout.finished, SPEC §10.2): written at a
clean end, not after an error or a signal, removed when a new session starts."""
from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.checkpoint.layout.finished import (
    FINISHED_FILE,
    FinishedMark,
    clear_finished,
    mark_finished,
    read_finished,
)


def test_mark_read_clear_round_trip(tmp_path):
    assert read_finished(tmp_path) is None
    path = mark_finished(tmp_path, step=12, checkpoint=str(tmp_path / "model.ckpt-12"))
    assert path == str(tmp_path / FINISHED_FILE)
    mark = read_finished(tmp_path)
    assert (mark.step, mark.checkpoint, mark.pid) == (12, "model.ckpt-12", os.getpid())
    assert sorted(os.listdir(tmp_path)) == [FINISHED_FILE]  # no temp file left behind
    with open(path) as f:
        assert json.load(f)["step"] == 12  # one JSON object, for people and scripts
    assert clear_finished(tmp_path) is True
    assert read_finished(tmp_path) is None
    assert clear_finished(tmp_path) is False


def test_a_damaged_mark_still_means_finished_with_a_warning(tmp_path, caplog):
    (tmp_path / FINISHED_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert read_finished(tmp_path) == FinishedMark()
    assert "treating the run as finished" in caplog.text


def train(logdir, last_step, *, body=None):
    model = torch.nn.Linear(2, 1)
    with MonitoredTrainingSession(str(logdir), model=model, hooks=[StopAtStepHook(last_step=last_step)],
                                  save_summaries_steps=None, log_step_count_steps=None) as s:
        while not s.should_stop():
            s.run(lambda: None)
            if body is not None:
                body(s)
    return s


def test_a_clean_end_marks_the_run_finished_and_a_new_session_clears_it(tmp_path):
    train(tmp_path, 3)
    mark = read_finished(tmp_path)
    assert (mark.step, mark.checkpoint) == (3, "model.ckpt-3")
    seen = []
    train(tmp_path, 5, body=lambda s: seen.append(read_finished(tmp_path)))
    assert seen and all(m is None for m in seen)  # not finished while the new session trains
    assert read_finished(tmp_path).step == 5


def test_an_error_does_not_mark_the_run_finished(tmp_path):
    def fail(s):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        train(tmp_path, 5, body=fail)
    assert read_finished(tmp_path) is None


def test_a_signal_stop_is_a_preemption_not_a_finished_run(tmp_path):
    def preempt(s):
        if s.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            assert s.coord.wait_for_stop(5)

    s = train(tmp_path, 100, body=preempt)
    assert s.stop_reason == "received SIGTERM"
    assert read_finished(tmp_path) is None
    assert os.path.isdir(tmp_path / f"model.ckpt-{s.global_step}")  # the preempted run saved its last step


def test_the_supervisor_front_door_marks_a_clean_end_too(tmp_path):
    from supervisor import Supervisor

    with Supervisor(tmp_path, model=torch.nn.Linear(2, 1)).managed_session() as s:
        for _ in range(3):
            s.run(lambda: None)
        assert read_finished(tmp_path) is None  # not while it trains
    mark = read_finished(tmp_path)
    assert (mark.step, mark.checkpoint) == (3, "model.ckpt-3")
