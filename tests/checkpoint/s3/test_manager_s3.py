"""`CheckpointManager` on an ``s3://bucket/prefix`` logdir (SPEC §16), against a real S3-compatible
server (moto over HTTP, the real s3fs/botocore client): the commit protocol (data objects, then
the manifest last with a create-only write), the index replaced only on the version read,
retention after it, and what a writer killed before the manifest leaves behind.

Reading back goes through the storage directly (the URL-aware readers are another slice)."""
from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import zlib

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager  # noqa: E402
from supervisor.checkpoint.layout.finished import clear_finished, mark_finished, read_finished  # noqa: E402
from supervisor.checkpoint.ownership.lease import LEASE_DIR  # noqa: E402
from supervisor.errors import CheckpointError  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = pytest.mark.timeout(120)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _state(seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return TrainingState.from_arguments(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.01))


@pytest.fixture
def logdir(s3_root) -> str:
    return s3_root + "/runs/exp"


@pytest.fixture
def make_manager(s3_server):
    made: list[CheckpointManager] = []

    def make(directory: str, **kwargs) -> CheckpointManager:
        manager = CheckpointManager(directory, storage_options=options(s3_server.endpoint), **kwargs)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        try:
            manager.close(failed=True)
        except Exception:  # noqa: BLE001 - the test already asserted what it wanted
            pass


def _record_writes(storage) -> list[tuple[str, str, dict]]:
    """Records every request the (real) storage sends, in order: (method, key, conditions)."""
    calls: list[tuple[str, str, dict]] = []
    real = storage.call

    def call(method, path, **kwargs):
        calls.append((method, path, {k: v for k, v in kwargs.items() if k.startswith("If")}))
        return real(method, path, **kwargs)

    storage.call = call
    return calls


def _manifest(storage, checkpoint: str) -> dict:
    return json.loads(storage.read_bytes(storage.join(checkpoint, "MANIFEST.json")))


def _data(storage, checkpoint: str, name: str = "state.pt") -> str:
    """Where the checkpoint's file ``name`` is: under the data root its manifest names (fencing.py)."""
    return storage.join(checkpoint, _manifest(storage, checkpoint)["root"], name)


def test_a_save_uploads_the_data_then_the_manifest_create_only_and_keeps_max_to_keep(logdir, make_manager):
    manager = make_manager(logdir, max_to_keep=2, save_mode="sync")
    manager.open()
    storage = manager.storage
    calls = _record_writes(storage)
    state = _state()
    for step in (1, 2, 3):
        assert manager.save(step, state) == f"{logdir}/model.ckpt-{step}"

    writes = [(m, p[len(logdir) + 1:], c) for m, p, c in calls if m in ("put_object", "complete_multipart_upload")]
    for step in (1, 2, 3):  # per checkpoint: state.pt (under its save's root), the manifest (create-only), the index
        mine = [w for w in writes if w[1].startswith(f"model.ckpt-{step}/")]
        assert len(mine) == 2 and re.fullmatch(rf"model\.ckpt-{step}/g\d{{16}}-[0-9a-f]{{16}}/state\.pt", mine[0][1])
        assert mine[1][1] == f"model.ckpt-{step}/MANIFEST.json" and mine[1][2] == {"IfNoneMatch": "*"}
        after = writes[writes.index(mine[1]) + 1]
        assert after[1] == "checkpoint" and after[2].keys() <= {"IfMatch", "IfNoneMatch"} and after[2]
    assert sorted(n for n in storage.listdir(logdir) if n.startswith("model.ckpt")) == ["model.ckpt-2", "model.ckpt-3"]
    assert manager.checkpoints == (f"{logdir}/model.ckpt-2", f"{logdir}/model.ckpt-3")
    index = storage.read_bytes(storage.join(logdir, "checkpoint")).decode()
    assert 'model_checkpoint_path: "model.ckpt-3"' in index and "model.ckpt-1" not in index

    manifest = _manifest(storage, f"{logdir}/model.ckpt-3")
    data = storage.read_bytes(_data(storage, f"{logdir}/model.ckpt-3"))
    assert manifest["step"] == 3
    assert manifest["files"]["state.pt"] == {"bytes": len(data), "checksum": f"crc32:{zlib.crc32(data):08x}"}
    payload = torch.load(io.BytesIO(data), weights_only=True)
    for key, value in state["model"].state_dict().items():
        assert torch.equal(payload["model"][key], value)


def test_a_refused_index_write_fails_the_save_loudly_and_deletes_nothing(logdir, make_manager, s3_storage):
    manager = make_manager(logdir, max_to_keep=1, save_mode="sync")
    manager.open()
    state = _state()
    manager.save(1, state)
    other = b'model_checkpoint_path: "model.ckpt-1"\n# replaced by another writer\n'
    s3_storage.write_atomic(f"{logdir}/checkpoint", other)  # another writer moved the index

    with pytest.raises(CheckpointError, match=r"index .*checkpoint could not be updated.*PreconditionFailed"):
        manager.save(2, state)
    assert s3_storage.read_bytes(f"{logdir}/checkpoint") == other  # never overwritten
    assert _manifest(s3_storage, f"{logdir}/model.ckpt-1")["step"] == 1  # retention deleted nothing
    assert s3_storage.exists(_data(s3_storage, f"{logdir}/model.ckpt-1"))


def test_resaving_a_committed_step_replaces_it(logdir, make_manager, caplog):
    manager = make_manager(logdir, save_mode="sync")
    manager.open()
    state = _state()
    manager.save(4, state)
    with torch.no_grad():
        state["model"][0].weight.add_(1.0)
    with caplog.at_level(logging.DEBUG, logger="supervisor.checkpoint"):
        manager.save(4, state)
    assert "replacing the existing checkpoint" in caplog.text
    data = manager.storage.read_bytes(_data(manager.storage, f"{logdir}/model.ckpt-4"))
    saved = torch.load(io.BytesIO(data), weights_only=True)["model"]["0.weight"]
    assert torch.equal(saved, state["model"][0].weight)
    assert _manifest(manager.storage, f"{logdir}/model.ckpt-4")["files"]["state.pt"]["bytes"] == len(data)


@pytest.mark.slow
def test_a_writer_killed_before_the_manifest_leaves_no_checkpoint_and_the_next_writer_cleans_up(
        s3_server, logdir, s3_storage, make_manager, caplog):
    s3_storage.write_atomic(f"{logdir}/notes/readme.txt", b"a user's object under the logdir")
    done = subprocess.run([sys.executable, os.path.join(HERE, "s3_writer.py"), s3_server.endpoint, logdir,
                           "--steps", "2", "--die-before-manifest-of", "2"],
                          capture_output=True, text=True, timeout=90,
                          env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == -9, done.stdout + done.stderr
    assert "committed 1" in done.stdout and "killing before" in done.stdout
    leftover = f"{logdir}/model.ckpt-2"
    uploaded = s3_storage.list_files(leftover)  # every data object (under the save's root), no manifest: no checkpoint
    assert len(uploaded) == 1 and uploaded[0].endswith("/state.pt"), uploaded
    assert 'model_checkpoint_path: "model.ckpt-1"' in s3_storage.read_bytes(f"{logdir}/checkpoint").decode()

    # The dead writer's lease would block the next writer until it expires (the lease's own
    # tests cover takeover after expiry); here it is cleared so the next writer opens at once.
    s3_storage.remove_tree(f"{logdir}/{LEASE_DIR}")
    manager = make_manager(logdir)
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        manager.open()
    assert any(r.levelno == logging.WARNING and leftover in r.getMessage() for r in caplog.records), caplog.text
    assert not s3_storage.isdir(leftover)
    kept = f"{logdir}/model.ckpt-1"
    assert s3_storage.list_files(kept) == ["MANIFEST.json", _data(s3_storage, kept)[len(kept) + 1:]]
    assert s3_storage.read_bytes(f"{logdir}/notes/readme.txt") == b"a user's object under the logdir"
    assert manager.checkpoints == (f"{logdir}/model.ckpt-1",)


def test_the_finished_mark_on_an_object_store(logdir, s3_storage):
    assert read_finished(logdir, s3_storage) is None
    path = mark_finished(logdir, step=7, checkpoint=f"{logdir}/model.ckpt-7", storage=s3_storage)
    assert path == f"{logdir}/.supervisor.finished"
    mark = read_finished(logdir, s3_storage)
    assert (mark.step, mark.checkpoint) == (7, "model.ckpt-7")
    assert clear_finished(logdir, s3_storage) is True
    assert read_finished(logdir, s3_storage) is None and clear_finished(logdir, s3_storage) is False


def test_sharded_checkpoints_on_an_object_store_are_accepted(logdir, s3_server):
    # Was refused until issue 24 item 5 (checkpoint_format="dcp" on s3://: tests/distributed/s3/).
    from supervisor.checkpoint.sharded.manager import ShardedCheckpointManager

    manager = ShardedCheckpointManager(logdir, storage_options=options(s3_server.endpoint))
    assert manager.storage.stages_in_place and manager.path_of(3) == f"{logdir}/model.ckpt-3"


def test_a_save_whose_upload_fails_mid_write_fails_cleanly_and_the_next_one_commits(s3_server, logdir, s3_storage,
                                                                                    caplog):
    """The server answers 503 to everything once ``state.pt``'s first part is on its way: the
    save fails with the policy's error naming the failed upload (not the clean-up's own failure),
    nothing is committed, and once the server is back the next save commits."""
    from tests.s3_fixtures import FaultProxy

    with FaultProxy(s3_server.port) as proxy:
        manager = CheckpointManager(logdir, save_mode="sync", max_consecutive_save_failures=2,
                                    storage_options={**options(proxy.endpoint), "part_size": 5 << 20})
        manager.open()
        try:
            torch.manual_seed(0)
            state = TrainingState.from_arguments(model=torch.nn.Linear(1200, 1200))  # 5.5 MiB: two parts
            real_call = manager.storage.call

            def call(method, path, **kwargs):  # the server goes away once the first part is on its way
                if method == "upload_part":
                    proxy.fail_all = True
                return real_call(method, path, **kwargs)

            manager.storage.call = call
            with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
                manager.save(1, state)  # tolerated (1 of 2): logged, not raised
            manager.storage.call = real_call
            failure = [r.getMessage() for r in caplog.records if "saving the checkpoint of step 1" in r.getMessage()]
            assert len(failure) == 1 and "upload_part answered 503 SlowDown" in failure[0], failure
            proxy.fail_all = False
            assert proxy.failed > 0
            assert not s3_storage.exists(f"{logdir}/model.ckpt-1/MANIFEST.json")
            manager.save(2, state)
            assert _manifest(s3_storage, f"{logdir}/model.ckpt-2")["step"] == 2
            assert manager.checkpoints == (f"{logdir}/model.ckpt-2",)
        finally:
            manager.close(failed=True)
