"""checkpoint_format="dcp": every rank's shards in one committed directory, sealed by the chief;
restored on the same world size, on a different one (resharding) and into a plain model."""
from __future__ import annotations

import json
import os

import pytest
import torch

from supervisor.checkpoint import verify_checkpoint
from supervisor.checkpoint.sharded import choose_checkpoint, load_into
from supervisor.checkpoint.load.loader import read_checkpoint
from supervisor.errors import CheckpointCorruptError

from .harness import describe, run_job


def _plain_full(path: str) -> dict[str, list]:
    torch.manual_seed(123)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 6))
    assert load_into(path, model) == 3
    return {k: v.flatten().tolist() for k, v in model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dtensor", "fsdp2"])
def test_sharded_save_restores_on_2_and_3_ranks_and_in_one_process(tmp_path, kind):
    logdir = str(tmp_path / "run")
    saved = run_job("dcp_save", 2, logdir, kind, timeout=150)
    assert all(r.returncode == 0 for r in saved), describe(saved)
    path = saved[0].result["path"]
    assert path == os.path.join(logdir, "model.ckpt-3")
    manifest = json.loads(open(os.path.join(path, "MANIFEST.json")).read())
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-0.pt", "rng-1.pt"]
    assert sorted(os.listdir(path)) == sorted([*manifest["files"], "MANIFEST.json"])
    assert manifest["world_size"] == 2 and manifest["step"] == 3
    verify_checkpoint(path)  # sizes and CRC-32 of every rank's files
    assert not [n for n in os.listdir(logdir) if ".tmp-" in n]
    full = saved[0].result["full"]
    assert saved[1].result["full"] == full

    sizes = (2, 3) if kind == "dtensor" else (3,)
    for size in sizes:
        restored = run_job("dcp_restore", size, logdir, kind, timeout=150)
        assert all(r.returncode == 0 for r in restored), describe(restored)
        for r in restored:
            assert (r.result["path"], r.result["step"]) == (path, 3)
            assert r.result["full"] == full, f"rank {r.rank} of {size} restored other values"
            assert r.result["after_one_more"] == restored[0].result["after_one_more"]
        # each rank that saved gets its own RNG stream back; a new rank gets a derived seed
        assert [r.result["rng"] for r in restored[:2]] == [s.result["rng"] for s in saved]
        if size == 3:
            assert restored[2].result["rng"] not in [s.result["rng"] for s in saved]
    assert _plain_full(path) == full
    # An evaluator (one process, no process group: the sidecar's read) reads every rank's files
    # once, verified, and gets the whole tensors.
    read = read_checkpoint(path)
    assert read.step == 3 and read.bytes_read == sum(r["bytes"] for r in manifest["files"].values()) + len(
        open(os.path.join(path, "MANIFEST.json"), "rb").read())
    assert {k: v.flatten().tolist() for k, v in read.payload["model"].items()} == full


@pytest.mark.slow
def test_a_damaged_shard_is_detected_and_never_restored(tmp_path):
    logdir = str(tmp_path / "run")
    saved = run_job("dcp_save", 2, logdir, "dtensor", timeout=150)
    assert all(r.returncode == 0 for r in saved), describe(saved)
    shard = os.path.join(logdir, "model.ckpt-3", "__1_0.distcp")
    with open(shard, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointCorruptError, match="__1_0.distcp checksum"):
        verify_checkpoint(os.path.join(logdir, "model.ckpt-3"))
    with pytest.raises(CheckpointCorruptError, match="none of the checkpoints.*__1_0.distcp checksum"):
        choose_checkpoint(logdir, "model.ckpt")  # what the chief runs before every rank restores


@pytest.mark.slow
def test_front_door_with_checkpoint_format_dcp_resumes_on_another_world_size(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("dcp_session", 2, logdir, "4", "fsdp2", timeout=150)
    assert all(r.returncode == 0 for r in first), describe(first)
    assert [r.result["end"] for r in first] == [4, 4]
    manifest = json.loads(open(os.path.join(logdir, "model.ckpt-4", "MANIFEST.json")).read())
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(manifest["files"])
    uninterrupted = run_job("dcp_session", 2, str(tmp_path / "straight"), "6", "fsdp2", timeout=150)
    resumed = run_job("dcp_session", 3, logdir, "6", "fsdp2", timeout=150)
    assert all(r.returncode == 0 for r in resumed + uninterrupted), describe(resumed + uninterrupted)
    assert [r.result["start"] for r in resumed] == [4, 4, 4]
    assert all(r.result["end"] == 6 for r in resumed)
    for name, values in uninterrupted[0].result["full"].items():  # same data every step, any world size
        assert resumed[0].result["full"][name] == pytest.approx(values, rel=1e-5, abs=1e-6), name


@pytest.mark.slow
def test_a_sharded_session_gives_each_rank_its_own_rng_back_after_a_restart(tmp_path):
    # A sharded session skips the agreement's gather of every rank's RNG to the chief: each rank
    # writes its own rng-<rank>.pt into the checkpoint, and reads its own back.
    logdir = str(tmp_path / "run")
    first = run_job("dcp_session", 2, logdir, "2", "dtensor", timeout=150)
    assert all(r.returncode == 0 for r in first), describe(first)
    manifest = json.loads(open(os.path.join(logdir, "model.ckpt-2", "MANIFEST.json")).read())
    assert {name for name in manifest["files"] if name.startswith("rng")} == {"rng-0.pt", "rng-1.pt"}
    resumed = run_job("dcp_session", 2, logdir, "4", "dtensor", timeout=150)
    assert all(r.returncode == 0 for r in resumed), describe(resumed)
    assert [r.result["start"] for r in resumed] == [2, 2]
    by_rank = lambda results: [r.result for r in sorted(results, key=lambda r: r.rank)]  # noqa: E731
    assert [r["first_draw"] for r in by_rank(resumed)] == [r["next_draw"] for r in by_rank(first)]
    assert first[0].result["next_draw"] != first[1].result["next_draw"]  # the ranks' streams differ


@pytest.mark.slow
def test_a_sharded_save_cut_by_a_killed_chief_is_never_committed(tmp_path):
    from supervisor.checkpoint import latest_checkpoint

    logdir = str(tmp_path / "run")
    killed = run_job("dcp_session", 2, logdir, "6", "dtensor", timeout=120, after_rank0_secs=20,
                     extra_env={"SUPERVISOR_TEST_KILL_SEAL_AT": "4"})  # saves: 0, 2, 4 (save_checkpoint_steps=2)
    assert "killing the chief while committing step 4" in killed[0].output, describe(killed)
    assert killed[0].returncode != 0 and killed[1].returncode != 0  # the other rank did not go on
    assert latest_checkpoint(logdir).endswith("model.ckpt-2")
    assert any(".tmp-" in n for n in os.listdir(logdir))  # the sealed but unrenamed shards
    resumed = run_job("dcp_session", 2, logdir, "6", "dtensor", timeout=150)
    assert all(r.returncode == 0 for r in resumed), describe(resumed)
    assert [r.result["start"] for r in resumed] == [2, 2]
    assert not any(".tmp-" in n for n in os.listdir(logdir))  # removed when the chief reopened the logdir
    for name in os.listdir(logdir):
        if name.startswith("model.ckpt-"):
            verify_checkpoint(os.path.join(logdir, name))
