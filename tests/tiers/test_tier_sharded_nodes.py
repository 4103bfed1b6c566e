"""Sharded checkpoint tiers across two nodes (SPEC §17, issue 33): two torchrun agents as two
nodes (c10d rendezvous, one rank each), each node with its own local tier, the logdir shared.
The node of group rank 1 is lost with its agent in step 10, once the local save of step 9 is
committed (SIGKILL);
a fresh agent takes its place — on the same node (its local tier intact) or on a new one (its
local tier empty). The job resumes, every rank at the same step: the newest step every rank can
restore from its local tier, or the logdir's newest when the new node has none (a WARNING); the
run that finishes matches an uninterrupted one bit for bit."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.distributed.harness import ROOT, free_port
from tests.tiers.conftest import STRAIGHT_LAST
from tests.distributed.test_node_replacement import _finish, _first_to_exit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LAST, LOST_AT = STRAIGHT_LAST, 10


def _agent(port: int, logdir: str, local_dir: str, mark: str, host: bool) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               NODE_LOSS=f"{LOST_AT}:{mark}", TIER_LOCAL_DIR=local_dir,
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # as test_node_replacement: a new node can join
    for key in [k for k in env if k.startswith("TORCHELASTIC_")]:
        del env[key]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--max-restarts=2", "--monitor-interval=0.5", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=tiers", f"--rdzv-conf=is_host={str(host).lower()}",
               "-m", "tests.tiers.tier_sharded_worker", "dcp_tiers", logdir, "unused", str(LAST), "4", "no"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.mark.parametrize("node", ["restarted", "replaced"])
def test_a_lost_node_resumes_from_the_newest_step_every_rank_holds(tmp_path, node, straight_end_digest):
    port, logdir, mark = free_port(), str(tmp_path / "run"), str(tmp_path / "lost")
    nodes = [str(tmp_path / "nodeA"), str(tmp_path / "nodeB")]
    first = [_agent(port, logdir, nodes[0], mark, host=True), _agent(port, logdir, nodes[1], mark, host=False)]
    deadline = time.monotonic() + 480
    try:
        index = _first_to_exit(first, deadline)
    except AssertionError:
        for proc in first:
            _finish(proc, 0)
        raise
    code, lost_out = _finish(first[index], deadline)
    if node == "replaced":
        shutil.rmtree(nodes[index])  # a new machine: its local tier is empty
    replacement = _agent(port, logdir, nodes[index], mark, host=False)
    outputs = {"survivor": _finish(first[1 - index], deadline), "replacement": _finish(replacement, deadline)}
    report = f"lost node (exit {code}):\n{lost_out[-3000:]}\n" + "\n".join(
        f"{name} (exit {c}):\n{out[-5000:]}" for name, (c, out) in outputs.items())
    assert os.path.exists(mark) and f"lost after step {LOST_AT}" in lost_out, report
    assert [c for c, _ in outputs.values()] == [0, 0], report
    restored = [re.findall(r"restored step=(\d+)", out) for _, out in outputs.values()]
    assert restored[0] and restored[1] and restored[0][-1] == restored[1][-1], report
    step = int(restored[1][-1])
    both = "".join(out for _, out in outputs.values())
    if node == "restarted" and "from the local tier" in both:
        # the newest step every rank committed: 9 (the node is lost in step 10's after_run, before
        # the boundary where step 10 is saved; the hook waited for step 9's commit)
        assert step == LOST_AT - 1, report
    else:  # a new node; or the ranks changed numbers: a rank's part is on the other node
        assert step < LOST_AT and "from the persistent tier" in both, report
        assert "WARNING" in both and ("has no checkpoint (a new or wiped node?)" in both
                                      or "not every rank's local tier holds" in both), report
    results = {}
    for name, (_, out) in outputs.items():
        results[name] = [line for line in out.splitlines() if "RESULT " in line][-1]
    digest = straight_end_digest  # an uninterrupted run's
    assert all(digest in line for line in results.values()), (report, digest)  # bit-exact
