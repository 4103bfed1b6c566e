"""The evaluator task of train_and_evaluate as a real process next to a real trainer process (the
max_steps exit, next to a torchrun job: test_evaluator_role_torchrun.py)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests import forked_io, zygote
from tests.estimator.estimator_toy import eval_scalars

SCRIPT = os.path.join(os.path.dirname(__file__), "evaluator_role_script.py")
pytestmark = pytest.mark.slow


def start(role, model_dir, *args):
    env = dict(os.environ, SUPERVISOR_TASK_TYPE=role, SUPERVISOR_TASK_ID="0", OMP_NUM_THREADS="1")
    out = forked_io.new_file(os.path.dirname(str(model_dir)), role)
    return zygote.Forked(SCRIPT, [model_dir, *args], env=env, output=out, stderr=out + ".stderr")


def finish(process, timeout):
    try:
        out = forked_io.communicate(process, timeout=timeout)
    except subprocess.TimeoutExpired:
        forked_io.finish(process)
        pytest.fail(f"process did not exit within {timeout} s; stderr:\n{_stderr(process)[-3000:]}")
    assert process.returncode == 0, _stderr(process)[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _stderr(process):
    return forked_io.output(process, process.output + ".stderr")


def kill(*processes):
    for process in processes:
        forked_io.finish(process)


def evaluated(model_dir):
    return [step for step, _ in eval_scalars(str(model_dir / "eval")).get("loss", [])]


def test_early_stopping_from_the_evaluator_and_the_evaluator_exits_when_the_trainer_finishes(tmp_path):
    """The trainer's stop_if_no_decrease_hook reads the evaluator process's events (lr=0: the loss
    never decreases, so it stops once evaluations span 10 steps); the evaluator, without
    max_steps (TF's never exited), evaluates the final checkpoint and exits on the finished mark."""
    trainer = start("chief", tmp_path, "--max-steps", 100_000, "--step-sleep", 0.02, "--lr", 0.0,
                    "--early-stop-steps", 10)
    evaluator = start("evaluator", tmp_path, "--lr", 0.0)
    try:
        trained = finish(trainer, timeout=240)
        result = finish(evaluator, timeout=120)
    finally:
        kill(trainer, evaluator)
    assert trained["checkpoint_step"] < 100_000 and trained["finished_mark"]
    steps = evaluated(tmp_path)
    assert steps[-1] == trained["checkpoint_step"] == result["metrics"]["global_step"]
    assert any(s - steps[0] >= 10 for s in steps[:-1])  # the plateau the hook saw
