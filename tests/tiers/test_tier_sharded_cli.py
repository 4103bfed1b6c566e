"""``ls``/``verify``/``inspect --local-dir`` on a sharded local tier (``checkpoint_format="dcp"``;
SPEC §13, §17, issue 33): the ``rank-<r>/`` parts of a real 2-rank gloo run sharing one node's
``local_dir`` are listed by step with the ranks holding them, each part verified, and the line
says what a restart restores — the newest step every rank holds, else the logdir's."""
from __future__ import annotations

import os

import pytest

from tests.cli.helpers import cli, cli_json, flip_byte
from tests.distributed.harness import describe, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> tuple[str, str]:
    """One 2-rank run (one node): the logdir holds steps 0 and 4, each rank's parts 5 and 6."""
    root = tmp_path_factory.mktemp("sharded-cli")
    logdir, local = str(root / "logdir"), str(root / "local")
    results = run_job("dcp_tiers", 2, logdir, local, "6", "4", "yes", module="tests.tiers.tier_sharded_worker",
                      timeout=240, extra_env={"TIER_LOCAL_DIR": local})
    assert all(r.returncode == 0 for r in results), describe(results)
    assert sorted(n for n in os.listdir(local) if n.startswith("rank-")) == ["rank-0", "rank-1"]
    return logdir, local


def _unpruned(row: dict) -> bool:
    """A rank's part of step 4 still in its local tier: the run ends by ``os._exit`` (CRASH=yes)
    right after its last local commit, and whether a rank's retention had removed the part of
    step 4 (persisted, older than its two newest) by then is timing; both are correct states."""
    part = row.get("rank") is not None and row.get("tier", "local") == "local"  # ls rows have a tier, verify's not
    return part and (row.get("step") == 4 or str(row.get("path", "")).endswith("/model.ckpt-4"))


def test_ls_lists_the_steps_with_the_ranks_holding_them_and_what_a_restart_restores(run_dirs):
    logdir, local = run_dirs
    result = cli("ls", logdir, "--local-dir", local)
    assert result.returncode == 0, result.stderr
    assert f"local tier (sharded, a part per rank): {local}: rank directories 0, 1 of a 2-rank job" in result.stdout
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["5", "model.ckpt-5", "0,1"] and line.endswith("ok") for line in lines), result.stdout
    assert any(line.split()[:3] == ["6", "model.ckpt-6", "0,1"] and line.endswith("ok") for line in lines)
    assert "a restart restores step 6 from the local tiers (every rank holds a committed part that verifies)" in \
        result.stdout
    result, rows = cli_json("ls", logdir, "--local-dir", local)
    rows = [r for r in rows if not _unpruned(r)]
    assert sorted((r["tier"], r["step"], r.get("rank")) for r in rows) == [
        ("local", 5, 0), ("local", 5, 1), ("local", 6, 0), ("local", 6, 1), ("persistent", 0, None),
        ("persistent", 4, None)]
    assert all(r["committed"] and r["world_size"] == 2 and r["verified"] for r in rows if r["tier"] == "local")
    result, inspected = cli_json("inspect", logdir, "--local-dir", local)  # rank 0's part of the step restored
    assert result.returncode == 0 and inspected["step"] == 6, result.stderr
    assert inspected["path"] == f"{local}/rank-0/model.ckpt-6"


def test_verify_checks_each_part_and_a_damaged_or_uncommitted_part_changes_the_restore(run_dirs):
    logdir, local = run_dirs
    result, rows = cli_json("verify", logdir, "--local-dir", local)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(r["path"] for r in rows if r.get("rank") is not None and not _unpruned(r)) == sorted(
        f"{local}/rank-{rank}/model.ckpt-{step}" for step in (5, 6) for rank in (0, 1))
    flip_byte(f"{local}/rank-1/model.ckpt-6/__1_0.distcp")
    result = cli("verify", logdir, "--local-dir", local)
    assert result.returncode == 1 and f"{local}/rank-1/model.ckpt-6: " in result.stdout and "FAILED" in result.stdout
    listed = cli("ls", logdir, "--local-dir", local)
    assert listed.returncode == 1
    assert any(line.split()[:3] == ["6", "model.ckpt-6", "0"] and "rank 1: FAILED" in line
               for line in listed.stdout.splitlines()), listed.stdout
    assert "a restart restores step 5 from the local tiers" in listed.stdout
    os.remove(f"{local}/rank-0/model.ckpt-5.all-ranks")  # step 5 not committed on rank 0: the logdir's step 4
    listed = cli("ls", logdir, "--local-dir", local)
    assert "rank 0: not committed (no .all-ranks mark: never restored)" in listed.stdout
    assert f"a restart restores step 4 from the persistent tier ({logdir}/model.ckpt-4)" in listed.stdout


def test_one_node_of_two_sees_its_own_ranks_only(run_dirs, tmp_path):
    logdir, local = run_dirs
    node = tmp_path / "node0"
    node.mkdir()
    os.symlink(f"{local}/rank-0", node / "rank-0")
    result = cli("ls", logdir, "--local-dir", str(node))
    assert "rank directory 0 of a 2-rank job" in result.stdout, result.stdout
    assert "if rank(s) 1 (not in " in result.stdout
