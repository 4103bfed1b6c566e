"""RunConfig(keep_best=...) (issue 34 item 2): in local train_and_evaluate the evaluation's
metrics — not the training step's — rank the checkpoints it evaluated; the best one survives
keep_checkpoint_max=1, and the index records the evaluation's values."""
from __future__ import annotations

import os
import re

import pytest

from supervisor import get_checkpoint_state
from supervisor.estimator import EvalSpec, RunConfig, TrainSpec, train_and_evaluate
from tests.estimator.estimator_toy import batches, endless, eval_scalars, make_estimator


def test_the_evaluations_best_checkpoint_survives_keep_checkpoint_max(tmp_path):
    config = RunConfig(str(tmp_path), save_checkpoints_steps=5, log_step_count_steps=0, save_summary_steps=0,
                       keep_checkpoint_max=1, keep_best=1, best_metric="loss")
    est = make_estimator(tmp_path, config=config, lr=0.5)
    train_and_evaluate(est, TrainSpec(endless(), max_steps=40), EvalSpec(lambda: batches(), steps=None, throttle_secs=0))
    losses = dict(eval_scalars(est.eval_dir())["loss"])  # step -> the evaluation's loss
    best = min(sorted(losses), key=lambda step: losses[step])
    assert best < 40, losses  # an old checkpoint: recency retention alone would delete it
    on_disk = sorted(int(m.group(1)) for n in os.listdir(tmp_path) if (m := re.fullmatch(r"model\.ckpt-(\d+)", n)))
    assert on_disk == sorted({best, 40})
    index = get_checkpoint_state(tmp_path)
    recorded = dict(zip((int(p.rsplit("-", 1)[1]) for p in index.all_model_checkpoint_paths),
                        index.all_model_checkpoint_metrics))
    assert recorded == {step: pytest.approx(losses[step]) for step in on_disk}


def test_run_config_refuses_keep_best_without_a_metric(tmp_path):
    with pytest.raises(ValueError, match="keep_best=3 needs best_metric="):
        RunConfig(str(tmp_path), keep_best=3)
