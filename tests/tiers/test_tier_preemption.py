"""Preemption with checkpoint tiers (SPEC §5.7, §17): on a real SIGTERM the final checkpoint goes
to the local tier first, then is persisted to the logdir before the process exits when the grace
allows; when it does not, a WARNING says what was not persisted, and a resume on the node
restores it from the local tier."""
from __future__ import annotations

import os
import signal
import time

import pytest

import supervisor
from tests import zygote
from tests.killing import trainer_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tier_trainer.py")


def _local_step(local: str) -> int:
    return int((supervisor.latest_checkpoint(local) or "-0").rsplit("-", 1)[1])


def _preempt(tmp_path, *extra: str) -> tuple[int, str]:
    """Starts the trainer for a long run, sends SIGTERM once its local tier holds step 5."""
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    log = tmp_path / "trainer.log"  # a file, not a pipe: a full pipe would block the trainer's logging
    proc = zygote.Forked(TRAINER, [logdir, local, "--steps", "100000", "--persist-steps", "50", "--out",
                                   tmp_path / "out.pt", *extra], env=trainer_env(), output=os.devnull, stderr=str(log))
    try:
        deadline = time.monotonic() + 240
        while _local_step(local) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, "the trainer did not reach step 5"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    return proc.returncode, log.read_text()


def test_sigterm_persists_the_final_checkpoint_before_exit(tmp_path):
    rc, stderr = _preempt(tmp_path)
    assert rc == 0, stderr[-3000:]
    final = _local_step(str(tmp_path / "local"))
    assert final > 5
    # persist_every_steps=50: only step 0 was due; the final one was persisted at the exit.
    assert supervisor.latest_checkpoint(str(tmp_path / "logdir")).endswith(f"model.ckpt-{final}")
    assert "were not persisted" not in stderr
    assert not os.path.exists(tmp_path / "logdir" / ".supervisor.finished")  # preempted: not finished


def test_sigterm_without_grace_says_what_was_not_persisted_and_the_node_resumes_it(tmp_path):
    rc, stderr = _preempt(tmp_path, "--persist-grace", "0")
    assert rc == 0, stderr[-3000:]
    final = _local_step(str(tmp_path / "local"))
    assert f"the checkpoint(s) of step {final} were not persisted to {tmp_path / 'logdir'}" in stderr
    assert "they stay in the local tier" in stderr
    assert supervisor.latest_checkpoint(str(tmp_path / "logdir")).endswith("model.ckpt-0")
    rc2 = zygote.python([TRAINER, tmp_path / "logdir", tmp_path / "local", "--steps", final, "--out",
                         tmp_path / "out.pt"], env=trainer_env(), timeout=120)
    assert rc2.returncode == 0, rc2.stderr[-3000:]
    assert f"restored step {final} from the local tier" in rc2.stderr
