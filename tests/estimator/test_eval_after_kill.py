"""Local train_and_evaluate after real SIGKILLs (issue 21 item 9): the checkpoint a run restores
is evaluated (and exported) if it never was, no step is evaluated or exported twice, and a rerun
of a finished job evaluates and exports nothing new."""
from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

from supervisor.checkpoint import latest_checkpoint
from supervisor.checkpoint.layout.format import read_manifest
from supervisor.estimator.exporters import RESULT_FILE, list_exports

from tests import zygote

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kill_train_and_evaluate.py")
MAX_STEPS = 12


def life(model_dir, kill_at=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("KILL_AT", None)
    if kill_at:
        env["KILL_AT"] = kill_at
    proc = zygote.python([CHILD, model_dir, MAX_STEPS], env=env, timeout=120)
    if kill_at:
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
        return None
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def restored_step(model_dir):
    path = latest_checkpoint(str(model_dir))
    return None if path is None else read_manifest(path).step


def evaluations(model_dir):
    """Counter of evaluated steps: one 'loss' event per evaluation, over every events file."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

    eval_dir = os.path.join(model_dir, "eval")
    steps = Counter()
    for name in sorted(os.listdir(eval_dir)):
        for event in LegacyEventFileLoader(os.path.join(eval_dir, name)).Load():
            if event.HasField("summary") and any(v.tag == "loss" for v in event.summary.value):
                steps[event.step] += 1
    return steps


def exported_steps(model_dir, name):
    steps = []
    for _, path in list_exports(os.path.join(model_dir, "export", name)):
        with open(os.path.join(path, RESULT_FILE)) as f:
            steps.append(json.load(f)["global_step"])
    return steps


def test_kills_during_evaluation_and_exports_leave_nothing_unevaluated_or_unexported_and_nothing_twice(tmp_path):
    model_dir = str(tmp_path / "run")
    life(model_dir, kill_at="eval:3")  # SIGKILL mid-evaluation of the newest checkpoint
    first_restore = restored_step(model_dir)
    assert first_restore not in evaluations(model_dir), first_restore  # the next life must evaluate it
    life(model_dir, kill_at="export:2")  # SIGKILL as the second export of that life starts
    second_restore = restored_step(model_dir)
    life(model_dir, kill_at=f"export_step:{MAX_STEPS}")  # the final evaluation is written, not exported
    assert evaluations(model_dir)[MAX_STEPS] == 1 and exported_steps(model_dir, "final") == []
    result = life(model_dir)  # catches the final exports up without evaluating again
    evaluated = evaluations(model_dir)
    assert result["metrics"]["global_step"] == MAX_STEPS
    for restored in (first_restore, second_restore):
        assert restored in evaluated, (restored, sorted(evaluated))  # the restored checkpoint was evaluated
        assert restored in exported_steps(model_dir, "latest"), restored  # and exported
    assert max(evaluated.values()) == 1, evaluated  # no step evaluated twice
    latest = exported_steps(model_dir, "latest")
    assert len(latest) == len(set(latest)), latest  # no step exported twice
    assert MAX_STEPS in latest and exported_steps(model_dir, "final") == [MAX_STEPS]

    again = life(model_dir)  # the job is finished: nothing new is evaluated or exported
    assert evaluations(model_dir) == evaluated
    assert exported_steps(model_dir, "latest") == latest
    assert exported_steps(model_dir, "final") == [MAX_STEPS]
    assert again["metrics"]["global_step"] == MAX_STEPS
    assert again["metrics"]["loss"] == pytest.approx(result["metrics"]["loss"])

