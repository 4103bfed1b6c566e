"""examples/adanet_style.py: SIGKILLed during an iteration's training and during the iteration
switch, the resumed run ends with the same ensemble (structure, bit-identical weights) as an
uninterrupted one; and a worker follows the chief's iterations, or times out cleanly."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import supervisor
from tests import forked_io, zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "adanet_style.py")
COUNTS = ["--iterations", "3", "--steps-per-iteration", "12", "--save-steps", "5"]


def run(logdir, *extra, timeout=300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return zygote.python([EXAMPLE, "--logdir", str(logdir), *COUNTS, *extra], timeout=timeout, env=env)


def run_until_killed(logdir, point, wait_for_step) -> subprocess.CompletedProcess:
    """Runs the example paused at ``point`` (inside a step), waits until the checkpoint of
    ``wait_for_step`` is committed, then SIGKILLs it from outside."""
    env = forked_io.unbuffered(dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))
    out, err = f"{logdir}-{point}.stdout", f"{logdir}-{point}.stderr"
    child = zygote.Forked(EXAMPLE, ["--logdir", str(logdir), *COUNTS, "--crash-at", f"pause:{point}"],
                          output=out, stderr=err, env=env)
    try:
        forked_io.wait_for(child, "paused at", timeout=300)
        deadline = time.monotonic() + 60
        while supervisor.latest_checkpoint(str(logdir)) != os.path.join(str(logdir), f"model.ckpt-{wait_for_step}"):
            assert time.monotonic() < deadline, "the checkpoint before the pause never committed"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait(60)
    finally:
        forked_io.finish(child)
    return subprocess.CompletedProcess(child.args, child.returncode, forked_io.output(child),
                                       forked_io.output(child, err))


def final_state(logdir):
    path = supervisor.latest_checkpoint(str(logdir))
    payload = supervisor.load_checkpoint(path)
    return path, payload["model"], payload["adanet"]


@pytest.mark.slow
def test_sigkill_during_training_and_switch_resumes_to_the_same_ensemble(tmp_path):
    with ThreadPoolExecutor(1) as pool:  # the uninterrupted reference runs beside the killed attempts
        uninterrupted = pool.submit(run, tmp_path / "reference")
        done, starts = _killed_attempts(tmp_path / "killed")
        reference = uninterrupted.result()
    assert reference.returncode == 0, reference.stdout + reference.stderr
    ref_path, ref_model, ref_book = final_state(tmp_path / "reference")
    assert starts[2].startswith("iteration 1: training ['t1_w8', 't1_w32'] from step 17 to 24"), starts  # mid-iteration
    assert starts[3].startswith(("iteration 1: training ['t1_w8', 't1_w32'] from step 24",
                                 "iteration 2: training ['t2_w8', 't2_w32'] from step 24")), starts

    path, model, book = final_state(tmp_path / "killed")
    assert os.path.basename(path) == os.path.basename(ref_path) == "model.ckpt-36"
    assert book == ref_book and book["iteration"] == 3 and len(book["frozen_widths"]) == 3
    assert list(model) == list(ref_model)  # the same structure, in the same order
    for key in ref_model:
        assert torch.equal(model[key], ref_model[key]), key
    assert done.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]  # same final ensemble, same accuracy


def _killed_attempts(logdir) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The example killed at each point in turn, then run to the end: (the last attempt, the
    first line of every attempt), each attempt checked to resume where the newest checkpoint is."""
    kills = ["switch:0:evaluated",   # iteration 0 trained and evaluated, the ensemble not yet grown
             "step:21",              # inside the second iteration's training (steps 12..24)
             "switch:1:overwrite"]   # inside the overwrite that grows the second iteration's ensemble
    expected_start = "iteration 0: training ['t0_w8', 't0_w32'] from step 0"
    starts = []
    for point in kills + [None]:
        if point == "step:21":  # a kill from outside once step 17's checkpoint is committed
            attempt = run_until_killed(logdir, point, wait_for_step=17)
        else:
            attempt = run(logdir, *(["--crash-at", point] if point else []))
        first = next(line for line in attempt.stdout.splitlines() if line.startswith("iteration"))
        starts.append(first)
        assert first.startswith(expected_start), (expected_start, attempt.stdout)
        if point is None:
            assert attempt.returncode == 0, attempt.stdout + attempt.stderr
            break
        assert attempt.returncode == -signal.SIGKILL, attempt.stdout + attempt.stderr
        assert f"crashing at {point}" in attempt.stdout or f"paused at {point}" in attempt.stdout
        # The next attempt must resume in the iteration and at the step of the newest committed checkpoint.
        latest = supervisor.latest_checkpoint(str(logdir))
        iteration = int(supervisor.load_variable(latest, "adanet/iteration"))
        step = int(supervisor.load_variable(latest, "global_step"))
        expected_start = f"iteration {iteration}: training ['t{iteration}_w8', 't{iteration}_w32'] from step {step}"
    return attempt, starts


@pytest.mark.slow
def test_worker_follows_the_chiefs_iterations(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    stderr = f"{tmp_path}-worker.stderr"
    worker = zygote.Forked(EXAMPLE, ["--logdir", str(tmp_path), *COUNTS, "--worker", "--worker-timeout-secs", "240"],
                           output=f"{tmp_path}-worker.stdout", stderr=stderr, env=env)
    try:
        chief = run(tmp_path)
        assert chief.returncode == 0, chief.stdout + chief.stderr
        out = forked_io.communicate(worker, timeout=240)
    finally:
        forked_io.finish(worker)
    assert worker.returncode == 0, out + forked_io.output(worker, stderr)
    published = [line for line in out.splitlines() if line.startswith("worker: iteration")]
    assert published and published[-1].startswith("worker: iteration 3 published in model.ckpt-36")
    assert "'t0_w" in published[-1] and "'t2_w" in published[-1]


def test_worker_times_out_when_no_chief_publishes(tmp_path):
    result = run(tmp_path, "--worker", "--worker-timeout-secs", "0.5", timeout=120)
    assert result.returncode == 1
    assert "the chief did not publish iteration 1" in result.stderr and "within 0.5 s" in result.stderr
