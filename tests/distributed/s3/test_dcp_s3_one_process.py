"""``checkpoint_format="dcp"`` on an ``s3://`` logdir in one process (issue 24 item 5, SPEC §12,
§16), against the real moto server: the same commit protocol as the local sharded path in
object-store form — the shards uploaded (checksummed while written, never read back), DCP's
``.metadata``, then ``MANIFEST.json`` last and create-only, then the index with ``If-Match``,
then retention; the readers (restore, verify, inspect, load_variable) on the URL. The 2-rank
jobs are in test_dcp_s3_ranks.py."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import list_variables, load_variable, read_checkpoint, verify_checkpoint  # noqa: E402
from supervisor.checkpoint.sharded import ShardedCheckpointManager, load_into, restore_sharded  # noqa: E402
from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402
from supervisor.errors import CheckpointError  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:.*single process")]


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 64)).sum().backward()
    optimizer.step()  # Adam's state exists: it is saved and restored too
    return TrainingState.from_arguments(model=model, optimizer=optimizer)


def _values(state: TrainingState) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": v.clone() for k, v in state["model"].state_dict().items()}
    for i, s in state["optimizer"].state_dict()["state"].items():
        out.update({f"optimizer/{i}/{k}": v.clone() for k, v in s.items()})
    return out


@pytest.fixture
def logdir(s3_root) -> str:
    return s3_root + "/runs/sharded"


@pytest.fixture
def opts(s3_server) -> dict:
    return options(s3_server.endpoint)


class Reads(dict):
    """Bytes the object store's reads returned, per object path; `requests`: each (path, length)."""

    requests: list[tuple[str, int]]


@pytest.fixture
def counted(monkeypatch):
    count = Reads()
    count.requests = []
    real_range, real_versioned = ObjectStoreStorage.read_range, ObjectStoreStorage.read_versioned

    def read_range(self, path, start, length, **kwargs):
        data = real_range(self, path, start, length, **kwargs)
        count[path] = count.get(path, 0) + len(data)
        count.requests.append((path, len(data)))
        return data

    def read_versioned(self, path, **kwargs):
        data, info = real_versioned(self, path, **kwargs)
        count[path] = count.get(path, 0) + len(data)
        return data, info

    monkeypatch.setattr(ObjectStoreStorage, "read_range", read_range)
    monkeypatch.setattr(ObjectStoreStorage, "read_versioned", read_versioned)
    return count


def _manager(logdir: str, opts: dict, **kwargs) -> ShardedCheckpointManager:
    manager = ShardedCheckpointManager(logdir, storage_options=opts, **kwargs)
    manager.open()
    return manager


def test_a_sharded_save_commits_manifest_last_reads_nothing_back_and_restores(logdir, opts, s3_storage, counted):
    state = _state(0)
    manager = _manager(logdir, opts, max_to_keep=2)
    try:
        for step in (1, 2, 3):
            path = manager.save(step, state, wait=True)
        assert path == f"{logdir}/model.ckpt-3"
    finally:
        manager.close()
    # No object of a checkpoint was read while saving: every checksum was computed while uploading.
    assert not [p for p in counted if "/model.ckpt-" in p], counted
    counted.clear()
    manifest = json.loads(s3_storage.read_bytes(f"{path}/MANIFEST.json"))
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "rng-0.pt"]
    root = manifest["root"]  # every file under the save's data root (supervisor/checkpoint/layout/fencing.py)
    assert sorted(s3_storage.list_files(path)) == sorted([*(f"{root}/{n}" for n in manifest["files"]), "MANIFEST.json"])
    listed = s3_storage.list_objects(path)
    assert {n: listed[f"{root}/{n}"].size for n in manifest["files"]} == \
        {n: r["bytes"] for n, r in manifest["files"].items()}
    assert verify_checkpoint(path, storage_options=opts).step == 3  # every CRC-32 recorded matches
    assert [n for n in s3_storage.listdir(logdir) if n.startswith("model.ckpt-")] == ["model.ckpt-2", "model.ckpt-3"]

    fresh = _state(7)
    restorer = _manager(logdir, opts)
    try:
        restored = restorer.restore(fresh)
    finally:
        restorer.close()
    assert (restored.global_step, restored.path) == (3, path)
    # The load alone (the chief verified before): the shard's items coalesced into one request.
    counted.requests.clear()
    restore_sharded(path, _state(8), step=3, storage=restorer.storage)
    shard = [n for p, n in counted.requests if p.endswith("__0_0.distcp")]
    assert shard == [manifest["files"]["__0_0.distcp"]["bytes"]], counted.requests
    expected, got = _values(state), _values(fresh)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_verify_inspect_and_the_evaluators_read_touch_each_byte_at_most_once(logdir, opts, s3_storage, counted):
    state = _state(1)
    manager = _manager(logdir, opts)
    try:
        path = manager.save(5, state, wait=True)
    finally:
        manager.close()
    manifest = json.loads(s3_storage.read_bytes(f"{path}/MANIFEST.json"))
    size = sum(r["bytes"] for r in manifest["files"].values()) + len(s3_storage.read_bytes(f"{path}/MANIFEST.json"))
    counted.clear()
    verify_checkpoint(path, storage_options=opts)
    assert sum(counted.values()) <= size and all(n <= size for n in counted.values()), counted
    counted.clear()
    read = read_checkpoint(path, storage_options=opts)
    assert read.step == 5 and sum(counted.values()) == read.bytes_read == size
    assert torch.equal(read.payload["model"]["2.bias"], state["model"].state_dict()["2.bias"])

    names = dict(list_variables(logdir, storage_options=opts))
    assert names["model/0.weight"] == (256, 64) and names["global_step"] == ()
    counted.clear()
    bias = load_variable(path, "model/2.bias", storage_options=opts)
    assert torch.equal(bias, state["model"].state_dict()["2.bias"])
    shards = sum(n for p, n in counted.items() if p.endswith(".distcp"))
    assert 0 < shards < manifest["files"]["__0_0.distcp"]["bytes"] / 10, counted  # that tensor's bytes, by range

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    assert load_into(path, model, storage_options=opts) == 5
    assert torch.equal(model[0].weight, state["model"][0].weight)


def test_a_refused_index_write_fails_the_save_loudly_and_deletes_nothing(logdir, opts, s3_storage):
    state = _state(2)
    manager = _manager(logdir, opts, max_to_keep=1, save_mode="sync")
    try:
        manager.save(1, state)
        other = b'model_checkpoint_path: "model.ckpt-1"\nall_model_checkpoint_paths: "model.ckpt-1"\n'
        s3_storage.write_atomic(f"{logdir}/checkpoint", other)  # another writer moved the index
        with pytest.raises(CheckpointError, match=r"model.ckpt-2.*publishing it failed.*PreconditionFailed"):
            manager.save(2, state)
    finally:
        manager.close(failed=True)
    assert s3_storage.read_bytes(f"{logdir}/checkpoint") == other  # never overwritten
    for name in ("model.ckpt-1", "model.ckpt-2"):  # retention (max_to_keep=1) deleted nothing
        assert s3_storage.exists(f"{logdir}/{name}/MANIFEST.json"), name


def test_ls_verify_and_inspect_on_the_command_line(logdir, opts, s3_storage, counted, capsys):
    from supervisor.cli import main

    state = _state(3)
    manager = _manager(logdir, opts)
    try:
        manager.save(4, state, wait=True)
        manager.save(8, state, wait=True)
    finally:
        manager.close()
    argv_opts = ["--storage-options", json.dumps(opts)]
    assert main(["ls", "--json", logdir, *argv_opts]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["verified"], r["indexed"]) for r in rows] == [(4, True, False), (8, True, True)]
    counted.clear()
    assert main(["verify", "--json", f"{logdir}/model.ckpt-4", *argv_opts]) == 0
    [row] = json.loads(capsys.readouterr().out)
    manifest = s3_storage.stat(f"{logdir}/model.ckpt-4/MANIFEST.json").size
    read = sum(n for p, n in counted.items() if p.startswith(f"{logdir}/model.ckpt-4/"))
    assert row["verified"] and 0 < read <= row["bytes"] + manifest  # each object once: <= 1.0x (the index aside)
    counted.clear()
    assert main(["inspect", "--json", logdir, *argv_opts]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["step"] == 8 and shown["indexed"] and shown["path"] == f"{logdir}/model.ckpt-8"
    names = {v["name"]: v for v in shown["variables"]}
    assert names["model/0.weight"]["shape"] == [256, 64] and names["model/0.weight"]["bytes"] == 256 * 64 * 4
    assert not [p for p in counted if p.endswith(".distcp")], counted  # names and shapes from .metadata alone


def test_the_ranges_a_restore_reads_are_coalesced_per_file():
    from types import SimpleNamespace as Info

    from supervisor.checkpoint.formats.dcp_storage import COALESCE_GAP, wanted_ranges

    infos = [Info(relative_path="__0_0.distcp", offset=o, length=n) for o, n in ((100, 50), (0, 100), (400, 10))]
    infos += [Info(relative_path="__1_0.distcp", offset=0, length=10),
              Info(relative_path="__1_0.distcp", offset=10 + COALESCE_GAP + 1, length=5)]
    assert wanted_ranges(infos) == {"__0_0.distcp": [(0, 410)],
                                    "__1_0.distcp": [(0, 10), (11 + COALESCE_GAP, 16 + COALESCE_GAP)]}


def test_a_chief_that_lost_its_lease_uploads_but_commits_nothing(logdir, opts, s3_storage):
    import time

    from supervisor.checkpoint.ownership.lease import Lease
    from supervisor.testing import FakeClock

    state = _state(4)
    manager = _manager(logdir, opts, lease_secs=30, save_mode="sync")
    try:
        manager.save(1, state)
        # A writer whose clock runs far ahead sees the lease expired and takes it over.
        Lease(s3_storage, logdir, lease_secs=30, clock=FakeClock(start_secs=time.time() + 300)).acquire(renew=False)
        with pytest.raises(CheckpointError, match="model.ckpt-2.*LeaseLostError: .*another writer took it over"):
            manager.save(2, state)
    finally:
        manager.close(failed=True)
    assert not s3_storage.isdir(f"{logdir}/model.ckpt-2")  # checked right before the manifest: nothing left
    assert [n for n in s3_storage.listdir(logdir) if n.startswith("model.ckpt")] == ["model.ckpt-1"]
    assert 'model_checkpoint_path: "model.ckpt-1"' in s3_storage.read_bytes(f"{logdir}/checkpoint").decode()
