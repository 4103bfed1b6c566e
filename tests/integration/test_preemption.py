"""Preemption and hard kills with real subprocesses (SPEC §5.7, §9, §15)."""
from __future__ import annotations

import os
import signal
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import supervisor
from tests import forked_io, zygote
from supervisor.events import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model: a second intra-op thread only spin-waits


def start_trainer(logdir, steps, *extra):
    return zygote.Forked(QUICKSTART, ["--logdir", logdir, "--steps", str(steps), "--save-secs", "0.2",
                                      "--summary-secs", "0.05", *extra],
                         output=forked_io.new_file(os.path.dirname(logdir), "trainer"), env=ENV)


def wait_for_checkpoint(logdir, proc, min_step=1, timeout_secs=120):
    deadline = time.monotonic() + timeout_secs
    while True:
        path = supervisor.latest_checkpoint(logdir)
        if path is not None and int(path.rsplit("-", 1)[1]) >= min_step:
            return int(path.rsplit("-", 1)[1])
        assert proc.poll() is None, forked_io.output(proc)
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)


def wait_for_summaries_past(logdir, proc, step, timeout_secs=120):
    deadline = time.monotonic() + timeout_secs
    while max((s for s, tags in read_scalars(logdir).items() if "loss" in tags), default=-1) <= step:
        assert proc.poll() is None, forked_io.output(proc)
        assert time.monotonic() < deadline, f"no loss summary past step {step} on disk in time"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigterm_writes_final_checkpoint_and_exits_143(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_trainer(logdir, 10**9)
    wait_for_checkpoint(logdir, proc, min_step=50)
    proc.send_signal(signal.SIGTERM)
    out = forked_io.communicate(proc, timeout=120)
    assert proc.returncode == 143, out  # 128 + SIGTERM: a scheduler sees an unfinished job
    assert "SIGTERM" in out
    stopped_at = int(out.split("stopped at step ")[1].split()[0])
    assert supervisor.latest_checkpoint(logdir).endswith(f"model.ckpt-{stopped_at}")  # the final one

    resumed = start_trainer(logdir, stopped_at + 20)
    out = forked_io.communicate(resumed, timeout=120)
    assert resumed.returncode == 0, out
    assert f"resuming at step {stopped_at}" in out and f"stopped at step {stopped_at + 20}" in out


@pytest.mark.slow
def test_sigkill_then_resume_gives_one_duplicate_free_curve(tmp_path):
    logdir = str(tmp_path / "run")
    proc = start_trainer(logdir, 10**9)
    killed_at = wait_for_checkpoint(logdir, proc, min_step=100)
    wait_for_summaries_past(logdir, proc, killed_at)  # the crashed run wrote some past its last checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    restored = int(supervisor.latest_checkpoint(logdir).rsplit("-", 1)[1])
    assert restored >= killed_at

    resumed = start_trainer(logdir, restored + 300)
    out = forked_io.communicate(resumed, timeout=120)
    assert resumed.returncode == 0, out
    assert f"resuming at step {restored}" in out

    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    loss_steps = [e.step for e in acc.Scalars("loss")]
    assert loss_steps == sorted(set(loss_steps)), f"duplicated or out-of-order loss steps {loss_steps}"
    # global_step/sec may repeat a step (a stalled loop shows as 0.0 there) but never goes back
    rate_steps = [e.step for e in acc.Scalars("global_step/sec")]
    assert rate_steps == sorted(rate_steps), f"out-of-order global_step/sec steps {rate_steps}"
    assert loss_steps[0] < restored < loss_steps[-1]  # one curve across the crash
