"""Checkpoint tiers on two real gloo ranks (SPEC §12, §17), replicated (DDP) state: the chief
restores the newest checkpoint that verifies in its tiers, reads it once and broadcasts it, so
every rank resumes at the same step bit for bit; with the chief's local tier gone (a replaced
node) the job resumes from the logdir's newest step, said in a WARNING."""
from __future__ import annotations

import shutil

import pytest

import supervisor
from tests.distributed.harness import describe, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODULE = "tests.tiers.tier_ranks_worker"


def test_two_ranks_resume_from_the_chiefs_local_tier_then_from_the_logdir(tmp_path):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    first = run_job("tiers", 2, logdir, local, "6", "yes", module=MODULE, timeout=240)
    assert all(r.returncode == 0 for r in first), describe(first)
    assert supervisor.latest_checkpoint(logdir).endswith("model.ckpt-0")  # persisted: the first one only
    assert supervisor.latest_checkpoint(f"{local}/node0").endswith("model.ckpt-6")

    second = run_job("tiers", 2, logdir, local, "8", "no", module=MODULE, timeout=240)
    assert all(r.returncode == 0 for r in second), describe(second)
    assert [r.result["start"] for r in second] == [6, 6]
    assert {r.result["digest"] for r in second} == {first[0].result["end_digest"]}  # bit-exact on both ranks
    assert f"restored step 6 from the local tier {local}/node0 (newer than the logdir's step 0)" in second[0].output
    assert "sent the" in second[0].output  # read once by the chief, broadcast to the other rank
    assert supervisor.latest_checkpoint(logdir).endswith("model.ckpt-8")  # the final one, persisted at close

    shutil.rmtree(f"{local}/node0")  # the chief's node is replaced
    third = run_job("tiers", 2, logdir, local, "9", "no", module=MODULE, timeout=240)
    assert all(r.returncode == 0 for r in third), describe(third)
    assert [r.result["start"] for r in third] == [8, 8]
    assert {r.result["digest"] for r in third} == {second[0].result["end_digest"]}
    assert "WARNING supervisor.checkpoint.tiers.manager: restored step 8 from the persistent tier" in third[0].output
    assert "the local tier has no checkpoint (a new or wiped node?)" in third[0].output
