"""``checkpoint_format="dcp"`` on an ``s3://`` logdir with real gloo process groups on loopback
and the real moto server (issue 24 item 5, SPEC §12, §16), through the front door
(``MonitoredTrainingSession(checkpoint_format="dcp", checkpoint_dir="s3://...")``): every rank
uploads its shards into the checkpoint's prefix and the chief writes ``MANIFEST.json`` last; a
run resumes on another world size (resharding) with exactly the saved values; a chief SIGKILLed
after every shard was uploaded but before the manifest, or rank 1 SIGKILLed mid-upload, leaves
no checkpoint — the next run removes what is left (WARNING), resumes from the previous
checkpoint and ends bit-identical to an uninterrupted run. (Each job is mostly process start-up:
five jobs in all.)"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint import latest_checkpoint, verify_checkpoint  # noqa: E402
from supervisor.checkpoint.sharded import ShardedCheckpointManager, choose_checkpoint  # noqa: E402
from supervisor.checkpoint.ownership.lease import LEASE_DIR  # noqa: E402
from tests.distributed.harness import describe, run_job  # noqa: E402
from tests.s3_fixtures import make_bucket, options  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

WORKER = "tests.distributed.s3.dcp_s3_worker"


def _session(world_size: int, url: str, last_step: int, opts: dict, **kwargs) -> list:
    return run_job("dcp_s3_session", world_size, url, str(last_step), json.dumps(opts), "fsdp2", module=WORKER,
                   timeout=150, **kwargs)


def _ok(ranks: list) -> list[dict]:
    assert all(r.returncode == 0 for r in ranks), describe(ranks)
    return [r.result for r in sorted(ranks, key=lambda r: r.rank)]


@pytest.fixture(scope="module")
def straight(s3_server, s3_storage) -> tuple[str, list[dict]]:
    """2 ranks straight to step 6 (saves at 0, 2, 4, 6): the reference every resumed run ends at."""
    url = make_bucket(s3_storage) + "/straight"
    return url, _ok(_session(2, url, 6, options(s3_server.endpoint)))


def test_every_ranks_shards_are_committed_and_a_3_rank_run_resumes_with_exactly_the_saved_values(
        s3_server, s3_storage, straight):
    opts = options(s3_server.endpoint)
    url, saved = straight
    path = f"{url}/model.ckpt-6"
    manifest = json.loads(s3_storage.read_bytes(f"{path}/MANIFEST.json"))
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-0.pt", "rng-1.pt"]
    assert manifest["world_size"] == 2 and manifest["step"] == 6
    root = manifest["root"]  # every file under the save's data root (supervisor/checkpoint/layout/fencing.py)
    assert sorted(s3_storage.list_files(path)) == sorted([*(f"{root}/{f}" for f in manifest["files"]), "MANIFEST.json"])
    assert verify_checkpoint(path, storage_options=opts).step == 6  # every rank's CRC-32s, recorded while uploading
    assert latest_checkpoint(url, storage_options=opts) == path

    # Another world size: 3 ranks each load their part of the 2 ranks' shards (resharding).
    resumed = _ok(_session(3, url, 6, opts))
    assert [r["start"] for r in resumed] == [6, 6, 6] and [r["end"] for r in resumed] == [6, 6, 6]
    assert all(r["restored"] == saved[0]["full"] for r in resumed)  # bit for bit


def test_a_chief_killed_before_the_manifest_leaves_no_checkpoint_and_the_next_run_resumes_bit_exact(
        s3_server, s3_storage, s3_root, straight):
    opts = options(s3_server.endpoint)
    url = s3_root + "/run"
    killed = _session(2, url, 6, opts, after_rank0_secs=30, extra_env={"SUPERVISOR_TEST_KILL_SEAL_AT": "4"})
    assert "killing the chief before the manifest of step 4" in killed[0].output, describe(killed)
    assert killed[0].returncode != 0 and killed[1].returncode != 0
    leftover = f"{url}/model.ckpt-4"
    uploaded = s3_storage.list_files(leftover)  # under the save's data root
    assert "MANIFEST.json" not in uploaded
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {name.split("/", 1)[-1] for name in uploaded}
    assert latest_checkpoint(url, storage_options=opts) == f"{url}/model.ckpt-2"  # no checkpoint appeared

    # The dead chief's lease would hold the next run off until it expires (the lease's own tests
    # cover takeover after expiry): cleared so that the next run opens at once.
    s3_storage.remove_tree(f"{url}/{LEASE_DIR}")
    resumed = _session(2, url, 6, opts)
    results = _ok(resumed)
    assert [r["start"] for r in results] == [2, 2] and [r["end"] for r in results] == [6, 6]
    assert "removing " + leftover in resumed[0].output and "interrupted checkpoint write" in resumed[0].output
    reference = straight[1]
    assert results[0]["full"] == reference[0]["full"]  # bit for bit
    assert [r["draw"] for r in results] == [r["draw"] for r in reference]  # each rank's RNG stream
    for step in (2, 4, 6):
        verify_checkpoint(f"{url}/model.ckpt-{step}", storage_options=opts)


def test_a_rank_killed_mid_upload_fails_the_save_on_every_rank_and_leaves_no_checkpoint(
        s3_server, s3_storage, s3_root):
    opts = options(s3_server.endpoint)
    url = s3_root + "/run"
    killed = _session(2, url, 6, opts, after_rank0_secs=30, extra_env={"SUPERVISOR_TEST_KILL_UPLOAD_AT": "4"})
    assert "killing rank 1 in the middle of uploading" in killed[1].output, describe(killed)
    assert killed[0].returncode != 0 and killed[1].returncode == -9
    assert "model.ckpt-4 failed" in killed[0].output  # the chief failed the save instead of sealing it
    assert not s3_storage.isdir(f"{url}/model.ckpt-4")  # what rank 0 had uploaded was removed
    assert latest_checkpoint(url, storage_options=opts) == f"{url}/model.ckpt-2"
    # The next writer opening the logdir (the chief of the next run; here in-process) restores
    # from the previous checkpoint: see the test above for the bit-exact resume.
    manager = ShardedCheckpointManager(url, storage_options=opts)
    manager.open()
    try:
        assert choose_checkpoint(url, "model.ckpt", storage=manager.storage) == (f"{url}/model.ckpt-2", 2)
    finally:
        manager.close()
