"""Every example runs in the suite with tiny step counts, so none can rot; and the README's
promise holds: a run leaves an index, checkpoints and an events file, and a rerun resumes."""
from __future__ import annotations

import glob
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
# One intra-op thread, as the other subprocess tests: a tiny model gains nothing from a second
# one, and on a busy 2-core machine its spin-waits cost the run several times its CPU.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_example(name, *args, timeout=240):
    result = zygote.python([os.path.join(EXAMPLES, name), *args], timeout=timeout, env=ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_quickstart_trains_then_resumes(tmp_path):
    logdir = str(tmp_path / "run")
    out = run_example("quickstart.py", "--logdir", logdir, "--steps", "300", "--save-secs", "0.2",
                      "--summary-secs", "0.1")
    assert "starting from step 0" in out and "stopped at step 300" in out
    assert os.path.isfile(os.path.join(logdir, "checkpoint"))
    assert os.path.isdir(os.path.join(logdir, "model.ckpt-300"))
    assert glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    accuracy = float(out.rsplit("points: ", 1)[1].split()[0])
    assert accuracy > 0.6  # a real classifier learned the spirals (chance is 0.33)

    out = run_example("quickstart.py", "--logdir", logdir, "--steps", "450", "--save-secs", "0.2",
                      "--summary-secs", "0.1")
    assert "resuming at step 300" in out and "stopped at step 450" in out
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    assert {"loss", "accuracy", "global_step/sec"} <= set(acc.Tags()["scalars"])


def test_custom_hook_example():
    out = run_example("custom_hook.py")
    assert "stopped at step 22" in out  # 0.1 * 0.9**22 < 0.01 <= 0.1 * 0.9**21


@pytest.mark.slow
def test_crash_recovery_example(tmp_path):
    out = run_example("crash_recovery.py", "--logdir", str(tmp_path / "crash"), "--kill-after-step", "100",
                      "--extra-steps", "50")
    killed = int(out.split("newest committed checkpoint: step ")[1].split()[0])
    assert f"resuming at step {killed}" in out
    assert f"restart resumed at step {killed}" in out
