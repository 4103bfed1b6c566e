"""Peer replicas of the sharded local tier (SPEC §17, issue 33): ``peer_replicas=True`` on 4 real
gloo ranks as 2 "nodes" (``LOCAL_WORLD_SIZE=2``, a local_dir per node). Each rank keeps a replica of
its partner's parts on the other node; a lost node resumes from the local tiers — its ranks fetch
their replicas — bit-exact; a damaged replica falls back to the logdir (WARNING); a rank killed
while a replica is in flight never leaves a partial replica counted; off by default."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from supervisor.checkpoint.load.loader import verify_checkpoint
from supervisor.checkpoint.tiers.sharded_parts import committed_steps
from tests.distributed.harness import describe, run_job
from tests.tiers.test_tier_sharded_kills import FAST_DETECTION, _check_logdir, _logdir_step, _restored, _verified

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MODULE = "tests.tiers.tier_sharded_worker"
PEERS = {"LOCAL_WORLD_SIZE": "2", "PEER_REPLICAS": "1"}
LAST = 8


def _job(logdir: str, local: str, last: int, crash: str = "no", env: dict | None = None, ok: bool = True,
         **kw) -> list:
    results = run_job("dcp_tiers", 4, logdir, local, str(last), "4", crash, module=MODULE, timeout=300,
                      extra_env={**PEERS, **(env or {})}, **kw)
    if ok:
        assert all(r.returncode == 0 for r in results), describe(results)
    return results


def _restorable(local: str, rank: int) -> set[int]:
    """Steps rank ``rank`` can restore: its own part (its node) or its replica (the other node)."""
    node, holder = rank // 2, (rank + 2) % 4
    return _verified(f"{local}/node{node}/rank-{rank}") | _verified(f"{local}/node{holder // 2}/peer-{rank}")


def _expected(logdir: str, local: str) -> int:
    common = set.intersection(*(_restorable(local, r) for r in range(4)))
    return max(max(common, default=-1), _logdir_step(logdir))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> list:
    """(d) An uninterrupted run, peer_replicas left at its default: nothing under ``peer-*``."""
    base = tmp_path_factory.mktemp("straight")
    results = _job(str(base / "logdir"), str(base / "local"), LAST, env={"PEER_REPLICAS": "0"})
    for node in (0, 1):
        names = os.listdir(base / "local" / f"node{node}")
        assert sorted(names) == [f"rank-{2 * node}", f"rank-{2 * node + 1}"], names
    return results


def test_a_lost_node_resumes_from_its_peers_replicas_bit_exact_and_a_damaged_replica_falls_back(tmp_path, straight):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    first = _job(logdir, local, 6, crash="yes")  # ends right after step 6's local commit and replicas
    assert _logdir_step(logdir) == 4
    for rank in range(4):  # each rank's replica is on the other node, committed like its own part
        holder = (rank + 2) % 4
        assert _verified(f"{local}/node{holder // 2}/peer-{rank}"), os.listdir(f"{local}/node{holder // 2}")
    shutil.copytree(local, tmp_path / "local-saved")
    shutil.copytree(logdir, tmp_path / "logdir-saved")

    shutil.rmtree(f"{local}/node1")  # (a) node 1 lost: ranks 2 and 3 have nothing of their own
    expected = _expected(logdir, local)
    assert expected > 4, expected  # newer than the logdir's: only the replicas hold it
    second = _job(logdir, local, LAST)
    print(f"node 1 lost after step 6 (logdir: step 4): restored step {expected} on every rank")
    assert [r.result["start"] for r in second] == [expected] * 4, describe(second)
    assert f"restored step {expected} from the local tier {local}/node0 on each of the 4 rank(s) (newer than the " \
           "logdir's step 4; 2 rank(s) without their own part restored their peer's replica" in second[0].output
    if expected == 6:  # model, optimizer and each rank's RNG as the first run left them
        assert {r.result["digest"] for r in second} == {first[0].result["end_digest"]}
        assert [r.result["first_draw"] for r in second] == [r.result["next_draw"] for r in first]
    assert second[0].result["end_digest"] == straight[0].result["end_digest"]  # bit-exact with an uninterrupted run
    assert _verified(f"{local}/node1/rank-2") and _verified(f"{local}/node0/peer-2")  # replicas again

    shutil.rmtree(local)  # (b) the same loss, and node 0's replicas of rank 2 damaged
    shutil.rmtree(logdir)
    shutil.copytree(tmp_path / "local-saved", local)
    shutil.copytree(tmp_path / "logdir-saved", logdir)
    shutil.rmtree(f"{local}/node1")
    for step in committed_steps(f"{local}/node0/peer-2", "model.ckpt"):
        with open(f"{local}/node0/peer-2/model.ckpt-{step}/__2_0.distcp", "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 0x01]))
    third = _job(logdir, local, LAST)
    assert [r.result["start"] for r in third] == [4] * 4, describe(third)
    assert "cannot be restored" in third[0].output and "peer-2/model.ckpt-" in third[0].output
    assert "WARNING supervisor.checkpoint.tiers.sharded: restored step 4 from the persistent tier" in third[0].output
    assert third[0].result["end_digest"] == straight[0].result["end_digest"]


#: (rank, n-th chunk swap on its replication thread): rank 2 (node 1) and rank 1 (node 0), each
#: killed with a replica half sent and half received — a replication is ~66 swaps (a part of
#: ~64 KiB in the worker's 1 KiB chunks), so these fall in the 3rd and the 4th replication.
KILLS = [(2, 150), (1, 240)]


def test_a_rank_killed_while_a_replica_is_in_flight_never_leaves_a_partial_replica_counted(tmp_path, straight):
    log = []
    for rank, n in KILLS:
        logdir, local = str(tmp_path / f"logdir-{rank}"), str(tmp_path / f"local-{rank}")
        results = _job(logdir, local, LAST, ok=False, after_rank0_secs=60,
                       env={"TIER_KILL": f"peer-swap:{n}:{rank}", **FAST_DETECTION})
        log.append(f"peer-swap:{n}:{rank}: rc={[r.returncode for r in results]}")
        assert f"killing rank {rank} at peer-swap" in results[rank].output, f"{log}\n{describe(results)}"
        assert results[rank].returncode == -9, f"{log}\n{describe(results)}"
        _check_logdir(logdir)
        for node in (0, 1):  # every replica counted verifies: none is partial
            for name in os.listdir(f"{local}/node{node}"):
                for step in committed_steps(f"{local}/node{node}/{name}", "model.ckpt"):
                    verify_checkpoint(f"{local}/node{node}/{name}/model.ckpt-{step}")
        shutil.rmtree(f"{local}/node{rank // 2}")  # and the killed rank's node is lost
        expected, persisted = _expected(logdir, local), _logdir_step(logdir)
        resumed = _job(logdir, local, LAST)
        log.append(f"  node {rank // 2} lost: logdir step {persisted}, expected={expected} "
                   f"restored={_restored(resumed[0].output)} replicas used: {'peer_replicas)' in resumed[0].output}")
        assert _restored(resumed[0].output) == (expected if expected >= 0 else None), f"{log}\n{describe(resumed)}"
        assert resumed[0].result["end_digest"] == straight[0].result["end_digest"], log
        for node in (0, 1):
            assert not [n for n in os.listdir(f"{local}/node{node}") if re.search(r"\.tmp-", n)]
    print("\n".join(log))
