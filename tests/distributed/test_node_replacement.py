"""Issue 31.4 with real torchrun: two agents as two nodes (c10d rendezvous, one rank each); the
node of group rank 1 is lost with its agent after step 14, and a fresh agent takes its place. Its
restart count starts at 0 while the survivor's is 1: the ranks must still form one group and
resume from the last commit (before: each waited on keys of its own restart count)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from .harness import ROOT, free_port


def _agent(port: int, logdir: str, mark: str, host: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SUPERVISOR_TEST_NODE_KILL="14", SUPERVISOR_TEST_NODE_MARK=mark,
               # torch 2.13's shared store cannot take a new node: the survivor's agent keeps its
               # bootstrap info and never publishes MASTER_ADDR for the round the newcomer joins
               # (DistStoreError: wait timeout ... /torch.rendezvous.<id>.1/MASTER_ADDR). Without
               # sharing, each round's rank 0 worker hosts a fresh store.
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    for key in [k for k in env if k.startswith("TORCHELASTIC_")]:
        del env[key]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--max-restarts=2", "--monitor-interval=0.5", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=replace", f"--rdzv-conf=is_host={str(host).lower()}",
               "tests/distributed/node_trainer.py", "--logdir", logdir, "--steps", "24", "--save-steps", "4"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, deadline: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return None, out


def _first_to_exit(procs: list[subprocess.Popen], deadline: float) -> int:
    while time.monotonic() < deadline:
        for i, proc in enumerate(procs):
            if proc.poll() is not None:
                return i
        time.sleep(0.2)
    raise AssertionError("no node was lost in time")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_replaced_node_rejoins_and_every_rank_resumes_from_the_last_commit(tmp_path):
    """The node that happens to be group rank 1 is the one lost."""
    import re

    port, logdir, mark = free_port(), str(tmp_path / "run"), str(tmp_path / "lost")
    first = [_agent(port, logdir, mark, host=True), _agent(port, logdir, mark, host=False)]
    deadline = time.monotonic() + 360
    try:
        index = _first_to_exit(first, deadline)
    except AssertionError:
        for proc in first:
            _finish(proc, 0)
        raise
    code, lost_out = _finish(first[index], deadline)
    replacement = _agent(port, logdir, mark, host=False)
    outputs = {"survivor": _finish(first[1 - index], deadline), "replacement": _finish(replacement, deadline)}
    report = f"lost node (exit {code}):\n{lost_out[-3000:]}\n" + "\n".join(
        f"{name} (exit {c}):\n{out[-5000:]}" for name, (c, out) in outputs.items())
    assert os.path.exists(mark) and "lost after step 14" in lost_out, report
    assert [c for c, _ in outputs.values()] == [0, 0], report
    survivor_out, replacement_out = outputs["survivor"][1], outputs["replacement"][1]
    assert "finished at step 24" in survivor_out and "finished at step 24" in replacement_out, report
    restored = [re.findall(r"restored step=(\d+)", out) for out in (survivor_out, replacement_out)]
    assert restored[1] and restored[0][-1] == restored[1][-1] and int(restored[1][-1]) >= 8, report
    rounds = [re.findall(r"\(attempt (\d+), round (\d+)\)", out)[-1] for out in (survivor_out, replacement_out)]
    assert rounds[0][0] == "1" and rounds[1][0] == "0" and rounds[0][1] == rounds[1][1], report
