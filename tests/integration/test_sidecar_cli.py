"""``evaluate LOGDIR --model ...`` (supervisor/cli/evaluate.py) and examples/sidecar.py, as processes."""
from __future__ import annotations

import argparse
import os
import signal
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from supervisor.checkpoint.layout.finished import mark_finished
from supervisor.cli import evaluate as cli_evaluate

from tests import forked_io, zygote
from tests.estimator.sidecar_helpers import StepTrainer, weight_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "sidecar.py")
HELPERS = "tests.estimator.sidecar_helpers"


def run_cli(*args, timeout=120):
    """``python -m supervisor.cli.evaluate ARGS``: a real process, forked from an interpreter that
    imported the CLI once (tests/zygote.py)."""
    return zygote.run(args, timeout=timeout, cwd=ROOT, module="supervisor.cli.evaluate")


def eval_steps(log_dir):
    acc = EventAccumulator(log_dir)
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def finished_run(tmp_path):
    trainer = StepTrainer(str(tmp_path / "run"))
    for step in (10, 20):
        trainer.save(step)
    trainer.close()
    mark_finished(trainer.directory, step=20)
    return trainer.directory


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        cli_evaluate.main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--model" in out and "--max-evaluations" in out and "exit code 0" in out.lower()


def test_evaluates_a_finished_run_and_exits_0(finished_run, tmp_path):
    data = tmp_path / "data.py"
    data.write_text("import torch\ndef batches():\n    return [torch.ones(2, 8)] * 3\n")
    result = run_cli(finished_run, "--model", f"{HELPERS}:make_model", "--data", f"{data}:batches",
                     "--eval-step", f"{HELPERS}:weight_metrics", "--poll-secs", "0.05")
    assert result.returncode == 0, result.stderr
    assert f"step 20: spread = 0, w = {weight_of(20):.6g}" in result.stdout
    assert "stopped (finished): 1 evaluated" in result.stdout
    assert eval_steps(os.path.join(finished_run, "eval")) == {"w": [20], "spread": [20]}


@pytest.mark.parametrize("args, message", [
    (["--model", "nocolon"], "must look like package.module:function"),
    (["--model", "no_such_module_xyz:f"], "cannot import no_such_module_xyz"),
    (["--model", f"{HELPERS}:nothing_here"], "has no attribute 'nothing_here'"),
    (["--model", f"{HELPERS}:make_model"], "no evaluation data: pass --data"),
    (["--model", f"{HELPERS}:make_model", "--data", f"{HELPERS}:make_model", "--steps", "0"],
     "steps must be a positive integer or None, got 0"),
])
def test_usage_errors_exit_2(finished_run, args, message, capsys):
    assert cli_evaluate.main([finished_run, *args]) == 2
    assert message in capsys.readouterr().err


def test_a_checkpoint_that_does_not_fit_the_model_exits_1(finished_run, tmp_path, capsys):
    factory = tmp_path / "other.py"
    factory.write_text("import torch\ndef model():\n    return torch.nn.Linear(3, 3)\n"
                       "def data():\n    return [torch.ones(1, 3)]\n")
    assert cli_evaluate.main([finished_run, "--model", f"{factory}:model", "--data", f"{factory}:data"]) == 1
    assert "does not fit the evaluator's model" in capsys.readouterr().err


def test_add_parser_and_run_follow_the_cli_contract(finished_run, capsys):
    """The dispatcher (supervisor/cli/__init__.py) calls add_parser(subparsers) and run(args)."""
    parser = argparse.ArgumentParser(prog="torch-supervisor")
    cli_evaluate.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evaluate", finished_run, "--model", f"{HELPERS}:make_model",
                              "--data", "tests.estimator.test_sidecar_evaluator:BATCHES.copy",
                              "--eval-step", f"{HELPERS}:weight_metrics", "--name", "cli",
                              "--max-evaluations", "1", "--poll-secs", "0.05"])
    assert cli_evaluate.run(args) == 0
    assert "stopped (max_evaluations): 1 evaluated" in capsys.readouterr().out
    assert eval_steps(os.path.join(finished_run, "eval_cli"))["w"] == [20]


@pytest.mark.slow
def test_sidecar_example_trainer_and_evaluator_as_two_processes(tmp_path):
    logdir = str(tmp_path / "run")
    result = zygote.python([EXAMPLE, "--logdir", logdir, "--steps", "120", "--save-steps", "40", "--timeout", "120"],
                           timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})  # a tiny model: one intra-op thread
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trainer: stopped at step 120" in result.stdout
    assert "evaluator: stopped (finished)" in result.stdout  # exited by itself after the final checkpoint
    steps = eval_steps(os.path.join(logdir, "eval"))
    assert steps["accuracy"][-1] == 120 and steps["loss"] == sorted(set(steps["loss"]))


def test_sigterm_stops_the_evaluator_with_exit_code_0(finished_run, tmp_path):
    """A waiting evaluator (no finished mark, no timeout) ends cleanly on SIGTERM."""
    os.remove(os.path.join(finished_run, ".supervisor.finished"))
    process = zygote.Forked(None, [finished_run, "--model", f"{HELPERS}:make_model", "--data",
                                   "tests.estimator.test_sidecar_evaluator:BATCHES.copy", "--eval-step",
                                   f"{HELPERS}:weight_metrics", "--poll-secs", "0.05"],
                            module="supervisor.cli.evaluate", output=str(tmp_path / "evaluate.out"), cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        log_dir = os.path.join(finished_run, "eval")
        while not (os.path.isdir(log_dir) and os.listdir(log_dir)):  # step 20 evaluated: now waiting
            assert process.poll() is None and time.monotonic() < deadline, forked_io.output(process)
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out = forked_io.communicate(process, timeout=60)
    finally:
        forked_io.finish(process)
    assert process.returncode == 0, out
    assert "stopped (stop requested): 1 evaluated" in out
