"""train_and_evaluate under real torchrun (2 gloo ranks: chief and worker from the rank) with an
evaluator process (SUPERVISOR_TASK_TYPE=evaluator) beside the job."""
from __future__ import annotations

import json
import os
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


@pytest.mark.slow
def test_torchrun_chief_and_worker_with_an_evaluator_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SUPERVISOR_TASK_TYPE", "SUPERVISOR_TASK_ID")}
    env["OMP_NUM_THREADS"] = "1"
    evaluator = start("evaluator", tmp_path, "--max-steps", 30)
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), SCRIPT,
                            str(tmp_path), "30"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err[-3000:]
        result = finish(evaluator, timeout=120)
    finally:
        kill(job, evaluator)
    ranks = sorted((json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["rank"])
    assert [(r["task_type"], r["task_id"]) for r in ranks] == [("chief", 0), ("worker", 0)]
    assert all(r["result"] == [None, None] and r["checkpoint_step"] == 30 for r in ranks)
    assert result["metrics"]["global_step"] == 30 and evaluated(tmp_path)[-1] == 30
