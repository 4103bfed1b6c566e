"""train_and_evaluate under real torchrun (2 gloo ranks: chief and worker from the rank) with an
evaluator process (SUPERVISOR_TASK_TYPE=evaluator) beside the job: the evaluator evaluates the
job's new checkpoints and exits once it has evaluated one at its max_steps, while the job trains on
(it is then killed)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from tests.integration.test_evaluator_role import evaluated, finish, kill, start

SCRIPT = os.path.join(os.path.dirname(__file__), "evaluator_role_torchrun_script.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_job(process: subprocess.Popen) -> str:
    """SIGTERM to torchrun, which forwards it to the ranks (they run in their own sessions) and
    waits for them; SIGKILL to the whole group if that takes too long."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate(timeout=60)
    return out


@pytest.mark.slow
def test_evaluator_exits_at_max_steps_next_to_a_torchrun_job(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SUPERVISOR_TASK_TYPE", "SUPERVISOR_TASK_ID")}
    env["OMP_NUM_THREADS"] = "1"
    # The evaluator starts first: torchrun's start (launcher, two ranks, rendezvous) is its head
    # start, so a loaded machine does not leave it only the checkpoint nearest max_steps to see.
    evaluator = start("evaluator", tmp_path, "--max-steps", 60)
    # fresh: torchrun's agent starts its own workers (fresh interpreters whatever starts the agent)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), SCRIPT,
                            str(tmp_path), "5000", "0.05"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    # 60 steps of 50 ms leave it ~3 s to see several checkpoints before max_steps (30 steps of
    # 20 ms sometimes left it only the first one).
    try:
        result = finish(evaluator, timeout=300)
        assert job.poll() is None  # the evaluator stopped on max_steps, not because the job ended
    finally:
        kill(evaluator)
        out = stop_job(job)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    ranks = sorted((r for r in lines if "task_type" in r), key=lambda r: r["rank"])
    assert [(r["task_type"], r["task_id"]) for r in ranks] == [("chief", 0), ("worker", 0)]
    assert not result["finished_mark"] and result["metrics"]["global_step"] >= 60
    steps = evaluated(tmp_path)
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == result["metrics"]["global_step"]
