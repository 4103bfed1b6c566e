"""Checkpoint tiers for sharded state (SPEC §17, issue 33): ``checkpoint_format="dcp"`` with a
``local_dir`` on real gloo ranks. Every rank keeps its own part in its node's local tier; every
K-th step is merged into a plain DCP checkpoint in the logdir; a resume restores the newest step
every rank holds — bit-exact: model, optimizer, each rank's RNG — or the logdir's newest when a
rank's local tier is empty (a replaced node), said in a WARNING; the logdir's copy reshards."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import supervisor
from supervisor.checkpoint import verify_checkpoint
from supervisor.checkpoint.sharded import load_into
from tests.distributed.harness import describe, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODULE = "tests.tiers.tier_sharded_worker"


def _job(size: int, logdir: str, local: str, last: int, crash: str = "no", **kw) -> list:
    results = run_job("dcp_tiers", size, logdir, local, str(last), "4", crash, module=MODULE, timeout=240, **kw)
    assert all(r.returncode == 0 for r in results), describe(results)
    return results


def test_two_ranks_resume_from_their_local_tiers_then_from_the_logdir_and_reshard(tmp_path):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    first = _job(2, logdir, local, 6, crash="yes")  # ends right after step 6's local commit
    assert supervisor.latest_checkpoint(logdir).endswith("model.ckpt-4")  # persisted: 0 and 4
    for rank in (0, 1):
        assert sorted(os.listdir(f"{local}/node{rank}/rank-{rank}")) == [
            "model.ckpt-5", "model.ckpt-5.all-ranks", "model.ckpt-6", "model.ckpt-6.all-ranks"]  # local_max_to_keep=2
        assert sorted(json.load(open(f"{local}/node{rank}/rank-{rank}/model.ckpt-6/MANIFEST.json"))["files"]) == [
            ".metadata", f"__{rank}_0.distcp", f"rng-{rank}.pt"]

    second = _job(2, logdir, local, 8)
    assert [r.result["start"] for r in second] == [6, 6]
    assert {r.result["digest"] for r in second} == {first[0].result["end_digest"]}  # model + optimizer, bit-exact
    assert [r.result["first_draw"] for r in second] == [r.result["next_draw"] for r in first]  # each rank's RNG
    assert f"restored step 6 from the local tier {local}/node0 on each of the 2 rank(s) (newer than the logdir's " \
           "step 4)" in second[0].output, describe(second)
    final = f"{logdir}/model.ckpt-8"  # persisted at close: the merged DCP checkpoint
    assert supervisor.latest_checkpoint(logdir) == final
    manifest = verify_checkpoint(final)
    assert sorted(manifest.files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rank-0.metadata",
                                      "rank-1.metadata", "rng-0.pt", "rng-1.pt"]
    assert manifest.world_size == 2 and not [n for n in os.listdir(logdir) if ".tmp-" in n]

    shutil.rmtree(f"{local}/node1")  # rank 1's node is replaced
    third = _job(2, logdir, local, 9)
    assert [r.result["start"] for r in third] == [8, 8]
    assert {r.result["digest"] for r in third} == {second[0].result["end_digest"]}
    assert [r.result["first_draw"] for r in third] == [r.result["next_draw"] for r in second]
    assert "WARNING supervisor.checkpoint.tiers.sharded: restored step 8 from the persistent tier" in third[0].output
    assert "rank 1's local tier has no checkpoint (a new or wiped node?); no step is lost" in third[0].output

    fourth = _job(3, logdir, local, 10)  # another world size: the parts do not fit, the logdir's copy reshards
    assert [r.result["start"] for r in fourth] == [9, 9, 9]
    assert {r.result["digest"] for r in fourth} == {third[0].result["end_digest"]}
    assert "was saved by 2 ranks, this job has 3" in fourth[0].output
    import torch

    from tests.distributed.worker import plain_model

    model = plain_model(0)  # one process (an evaluator) reads the merged checkpoint whole
    assert load_into(f"{logdir}/model.ckpt-9", model) == 9
    assert isinstance(next(model.parameters()), torch.Tensor)


def test_a_damaged_local_part_makes_every_rank_take_the_next_older_common_step(tmp_path):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    _job(2, logdir, local, 6, crash="yes")
    shard = f"{local}/node1/rank-1/model.ckpt-6/__1_0.distcp"
    with open(shard, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0x01]))
    resumed = _job(2, logdir, local, 7)
    assert [r.result["start"] for r in resumed] == [5, 5], describe(resumed)
    assert "the local tier's part" in resumed[1].output and "model.ckpt-6 (step 6) cannot be restored" in \
        resumed[1].output
    assert f"restored step 5 from the local tier {local}/node0" in resumed[0].output
    straight = _job(2, str(tmp_path / "straight"), str(tmp_path / "straight-local"), 7)
    assert resumed[0].result["end_digest"] == straight[0].result["end_digest"]  # bit-exact with an uninterrupted run


def test_after_close_each_local_tier_holds_max_to_keep_and_nothing_already_persisted(tmp_path):
    """A slow logdir (step 4's copy held by a handshake until the last save committed): each rank's
    local tier holds at most ``local_max_to_keep`` (2) plus the steps not yet persisted, after the
    close too — step 4, persisted, is not kept past it."""
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    results = _job(2, logdir, local, 6, extra_env={"HOLD_COPY": "4"})
    assert [n for n in sorted(os.listdir(logdir)) if n.startswith("model.ckpt-")] == [
        "model.ckpt-0", "model.ckpt-4", "model.ckpt-6"]
    for r in results:
        assert r.result["parts"] == ["model.ckpt-5", "model.ckpt-5.all-ranks", "model.ckpt-6",
                                     "model.ckpt-6.all-ranks"], describe(results)
