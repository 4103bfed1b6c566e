"""The readers on ``s3://`` logdirs (issue 24 item 6, SPEC §16) against a real S3-compatible
server (moto over HTTP, the real s3fs/botocore client): checkpoints written locally by
`CheckpointManager` and uploaded the way the commit protocol does (data objects, then the
manifest create-only, then the index), then read, verified, chosen, iterated and inspected from
the URL — with bytes counted at the storage (read once: <= 1.0x; one tensor: a ranged read)."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import supervisor  # noqa: E402 - after the skip
from supervisor.checkpoint import (  # noqa: E402
    checkpoints_iterator, latest_checkpoint, list_variables, load_checkpoint, load_variable, read_checkpoint,
    verify_checkpoint)
from supervisor.checkpoint.load.apply import apply_checkpoint  # noqa: E402
from supervisor.checkpoint.load.choose import choose_checkpoint, find_and_load  # noqa: E402
from supervisor.checkpoint.layout.format import list_committed  # noqa: E402
from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError  # noqa: E402
from supervisor.testing import FakeClock  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _model(step: int) -> torch.nn.Module:
    torch.manual_seed(step)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 8))  # 1 MiB + 32 KiB


@pytest.fixture(scope="module")
def local_logdir(tmp_path_factory) -> str:
    """Three committed checkpoints (steps 1-3) written by the real manager."""
    logdir = str(tmp_path_factory.mktemp("run"))
    with supervisor.CheckpointManager(logdir, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, supervisor.TrainingState.from_arguments(model=_model(step)))
    return logdir


def upload(storage, logdir: str, url: str, *, names=None, manifest: bool = True) -> None:
    """Each checkpoint's data objects, then its manifest create-only (the commit), then the index."""
    for name in names or sorted(n for n in os.listdir(logdir) if n.startswith("model.ckpt-")):
        for f in sorted(os.listdir(os.path.join(logdir, name))):
            if f != "MANIFEST.json":
                storage.write_atomic(storage.join(url, name, f), _read(logdir, name, f))
        if manifest:
            storage.create_exclusive(storage.join(url, name, "MANIFEST.json"), _read(logdir, name, "MANIFEST.json"))
    if names is None:
        storage.write_atomic(storage.join(url, "checkpoint"), _read(logdir, "checkpoint"))


def _read(*parts: str) -> bytes:
    with open(os.path.join(*parts), "rb") as f:
        return f.read()


def _size(logdir: str, name: str) -> int:
    directory = os.path.join(logdir, name)
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


@pytest.fixture
def s3_run(s3_server, s3_storage, s3_root, local_logdir):
    url = s3_root + "/run"
    upload(s3_storage, local_logdir, url)
    return url, options(s3_server.endpoint)


@pytest.fixture
def counted(monkeypatch):
    """Bytes the object store's reads return (every ranged and whole-object GET of the reader)."""
    count = {"bytes": 0, "ranges": []}
    real_range, real_versioned = ObjectStoreStorage.read_range, ObjectStoreStorage.read_versioned

    def read_range(self, path, start, length, **kwargs):
        data = real_range(self, path, start, length, **kwargs)
        count["bytes"] += len(data)
        count["ranges"].append((path, start, len(data)))
        return data

    def read_versioned(self, path, **kwargs):
        data, info = real_versioned(self, path, **kwargs)
        count["bytes"] += len(data)
        return data, info

    monkeypatch.setattr(ObjectStoreStorage, "read_range", read_range)
    monkeypatch.setattr(ObjectStoreStorage, "read_versioned", read_versioned)
    return count


def test_read_checkpoint_from_a_url_reads_every_byte_once(s3_run, local_logdir, counted):
    url, opts = s3_run
    ckpt = read_checkpoint(url + "/model.ckpt-3", storage_options=opts)
    assert ckpt.step == 3 and ckpt.path == url + "/model.ckpt-3"
    expected = _model(3).state_dict()
    assert all(torch.equal(ckpt.payload["model"][k], v) for k, v in expected.items())
    size = _size(local_logdir, "model.ckpt-3")
    assert ckpt.bytes_read == size
    assert counted["bytes"] <= size  # read once, verified in the same read: <= 1.0x


def test_latest_verify_and_the_iterator_follow_the_url(s3_run, counted):
    url, opts = s3_run
    assert latest_checkpoint(url, storage_options=opts) == url + "/model.ckpt-3"
    assert verify_checkpoint(url + "/model.ckpt-2", storage_options=opts).step == 2
    got = list(checkpoints_iterator(url, timeout=0, storage_options=opts, clock=FakeClock()))
    assert got == [url + "/model.ckpt-3"]


def test_load_checkpoint_and_restore_choose_the_newest_good_one(s3_run, s3_storage):
    url, opts = s3_run
    assert load_checkpoint(url + "/model.ckpt-2", storage_options=opts)["global_step"] == 2
    storage = ObjectStoreStorage.from_url(url, opts)
    loaded = find_and_load(url, "model.ckpt", storage=storage)
    model = _model(0)
    restored = apply_checkpoint(loaded, supervisor.TrainingState.from_arguments(model=model), restore_rng=False)
    assert restored.global_step == 3 and restored.path == url + "/model.ckpt-3"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in _model(3).state_dict().items())


def test_a_corrupted_object_is_damage_named_by_its_url_and_restore_falls_back(s3_run, s3_storage, local_logdir,
                                                                              caplog):
    url, opts = s3_run
    state = url + "/model.ckpt-3/state.pt"
    data = bytearray(_read(local_logdir, "model.ckpt-3", "state.pt"))
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    s3_storage.write_atomic(state, bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"s3://.*/run/model.ckpt-3: state.pt checksum"):
        read_checkpoint(url + "/model.ckpt-3", storage_options=opts)
    with pytest.raises(CheckpointCorruptError, match="model.ckpt-3: state.pt checksum"):
        verify_checkpoint(url + "/model.ckpt-3", storage_options=opts)
    storage = ObjectStoreStorage.from_url(url, opts)
    assert find_and_load(url, "model.ckpt", storage=storage).step == 2
    assert any("skipping checkpoint" in r.getMessage() and "model.ckpt-3" in r.getMessage() for r in caplog.records)
    assert choose_checkpoint(url, "model.ckpt", storage=storage) == (url + "/model.ckpt-2", 2)


def test_a_prefix_without_a_manifest_is_no_checkpoint(s3_server, s3_storage, s3_root, local_logdir):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    upload(s3_storage, local_logdir, url, names=["model.ckpt-1"])
    upload(s3_storage, local_logdir, url, names=["model.ckpt-2"], manifest=False)  # an upload in progress
    storage = ObjectStoreStorage.from_url(url, opts)
    assert list_committed(url, "model.ckpt", storage) == [(1, "model.ckpt-1")]
    assert find_and_load(url, "model.ckpt", storage=storage).step == 1  # no index: the newest committed
    with pytest.raises(CheckpointNotFoundError, match="no committed checkpoint"):
        read_checkpoint(url + "/model.ckpt-2", storage_options=opts)


def test_list_and_load_variable_read_one_tensor_by_range(s3_run, local_logdir, counted):
    url, opts = s3_run
    names = dict(list_variables(url, storage_options=opts))
    assert names["model/0.weight"] == (1024, 256) and names["global_step"] == ()
    counted["bytes"], counted["ranges"] = 0, []
    bias = load_variable(url + "/model.ckpt-2", "model/1.bias", storage_options=opts)
    assert torch.equal(bias, _model(2).state_dict()["1.bias"])
    size = os.path.getsize(os.path.join(local_logdir, "model.ckpt-2", "state.pt"))
    assert counted["bytes"] < size / 4, counted  # never the whole object for one tensor
    bias_bytes = 8 * 4
    assert any(length == bias_bytes for _, _, length in counted["ranges"])  # the tensor: one ranged read
    assert int(load_variable(url, "global_step", storage_options=opts)) == 3


def test_verify_reads_each_object_once_and_size_mode_reads_only_the_manifest(s3_run, local_logdir, counted):
    url, opts = s3_run
    size = _size(local_logdir, "model.ckpt-1")
    verify_checkpoint(url + "/model.ckpt-1", storage_options=opts)
    assert 0 < counted["bytes"] <= size
    counted["bytes"] = 0
    verify_checkpoint(url + "/model.ckpt-1", "size", storage_options=opts)
    assert counted["bytes"] == os.path.getsize(os.path.join(local_logdir, "model.ckpt-1", "MANIFEST.json"))


def test_retention_deleting_the_objects_mid_read_is_vanished_not_damage(s3_run, s3_storage, monkeypatch):
    """On an object store nothing keeps a deleted object's bytes: each ranged read carries
    If-Match on the ETag listed, so a deletion (or a rewrite) mid-read is "vanished" — a newer
    checkpoint exists — never a mix of two versions nor "corrupt"."""
    import supervisor.checkpoint.load.loader as loader
    from supervisor.errors import CheckpointVanishedError

    url, opts = s3_run
    real_open_listed = loader._open_listed

    def open_then_retention(snapshot, path, manifest):
        real_open_listed(snapshot, path, manifest)
        s3_storage.remove_tree(path)

    monkeypatch.setattr(loader, "_open_listed", open_then_retention)
    with pytest.raises(CheckpointVanishedError, match="model.ckpt-2: state.pt was deleted or replaced"):
        read_checkpoint(url + "/model.ckpt-2", storage_options=opts)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_sharded_checkpoint_is_read_once_from_the_url(s3_server, s3_storage, s3_root, tmp_path, counted):
    from tests.estimator.sidecar_helpers import weight_of
    from tests.estimator.test_sidecar_dcp import train_sharded

    logdir = str(tmp_path / "dcp")
    train_sharded(logdir, steps=4, every=4)
    url, opts = s3_root + "/dcp", options(s3_server.endpoint)
    upload(s3_storage, logdir, url)
    latest = latest_checkpoint(url, storage_options=opts)
    assert latest == url + "/model.ckpt-4"
    counted["bytes"] = 0
    ckpt = read_checkpoint(latest, storage_options=opts)
    assert ckpt.step == 4 and all(torch.all(t == weight_of(4)) for t in ckpt.payload["model"].values())
    assert counted["bytes"] == ckpt.bytes_read == _size(logdir, "model.ckpt-4")
    assert load_checkpoint(latest, storage_options=opts)["global_step"] == 4
