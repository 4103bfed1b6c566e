"""The evaluation session's own INFO lines are quiet, a training session's alongside are not
(issue 32 item 2): the quiet filter covers every logger under ``supervisor.creators`` and
``supervisor.engine.session``, not only those two loggers (a logger's filter never sees the
records of its children)."""
from __future__ import annotations

import logging
import threading

import torch

from supervisor import MonitoredTrainingSession
from supervisor.estimator.sidecar import SidecarEvaluator

from tests.estimator.sidecar_helpers import StepTrainer, make_model, weight_metrics

# Loggers below the quieted ones: a creator module logging under its own name (e.g. the chief's),
# made, like a module's logger, before the evaluation starts.
CHILDREN = ("supervisor.creators.chief", "supervisor.creators.worker", "supervisor.engine.session.close")
for _name in CHILDREN:
    logging.getLogger(_name)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def of(self, thread: str) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.threadName == thread]


def _train_once(logdir: str, evaluating: threading.Event, trained: threading.Event) -> None:
    """Once the evaluation session is open: a training session restores, logs, closes."""
    try:
        assert evaluating.wait(60), "the evaluation never started"
        with MonitoredTrainingSession(logdir, model=make_model(), save_checkpoint_steps=None,
                                      save_summaries_steps=None, log_step_count_steps=None, handle_signals=False):
            for name in CHILDREN:
                logging.getLogger(name).info("a training line under %s", name)
    finally:
        trained.set()


def test_the_evaluation_sessions_lines_are_quiet_and_a_training_sessions_alongside_are_not(tmp_path):
    logdir = str(tmp_path / "run")
    trainer = StepTrainer(logdir)
    trainer.save(2)
    trainer.close()
    evaluating, trained = threading.Event(), threading.Event()

    def eval_step(model, batch):  # inside the evaluation session, its quiet filter installed
        for name in CHILDREN:
            logging.getLogger(name).info("an evaluation line under %s", name)
        evaluating.set()
        assert trained.wait(60), "the training session never ran"  # it runs while this session is open
        return weight_metrics(model)

    evaluator = SidecarEvaluator(make_model(), [torch.ones(1, 8)], logdir, eval_step=eval_step,
                                 max_evaluations=1, poll_secs=0.05, timeout=60)
    records, root = _Records(), logging.getLogger()
    level = root.level
    root.addHandler(records)
    root.setLevel(logging.INFO)
    training = threading.Thread(target=_train_once, args=(logdir, evaluating, trained), name="trainer")
    try:
        training.start()
        results = evaluator.start()
    finally:
        trained.set()
        training.join(60)
        root.removeHandler(records)
        root.setLevel(level)
    assert [r.metrics["global_step"] for r in results] == [2]
    evaluation, training_lines = records.of("MainThread"), records.of("trainer")
    assert any("evaluating" in line for line in evaluation), evaluation  # the evaluator's own lines stay
    assert not [line for line in evaluation if line.startswith(("supervisor.creators", "supervisor.engine.session"))
                or "restored step=" in line], evaluation
    assert any(line.startswith("supervisor.creators: restored step=2") for line in training_lines), training_lines
    assert [line for line in training_lines if "a training line" in line] == [
        f"{name}: a training line under {name}" for name in CHILDREN]
