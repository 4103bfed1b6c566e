"""Two tiers in one process (SPEC §17), with the logdir on a local directory and on a real S3
server: saves land in the local tier, the due ones are copied to the logdir verified, the logdir's
index never names a checkpoint that is only local, restores take the newest checkpoint that
verifies in either tier and fall back across tiers on damage."""
from __future__ import annotations

import logging
import os
import shutil
import threading

import pytest
import torch

import supervisor
from supervisor.checkpoint.tiers import persist
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.load.loader import verify_checkpoint
from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
from supervisor.errors import CheckpointError
from supervisor.state import TrainingState

pytestmark = pytest.mark.timeout(120)


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    return TrainingState.from_arguments(model=torch.nn.Linear(4, 3))


def _manager(storage_logdir, local_dir, **kwargs) -> TieredCheckpointManager:
    _, logdir, options = storage_logdir
    kwargs.setdefault("persist_every_steps", 3)
    return TieredCheckpointManager(logdir, local_dir=str(local_dir), save_mode="sync", storage_options=options,
                                   **kwargs)


def _indexed(storage, logdir) -> list[str]:
    index = read_index(logdir, storage=storage)
    return [] if index is None else list(index.all_model_checkpoint_paths)


def _steps(storage, directory) -> list[int]:
    return sorted(supervisor.checkpoint.step_of(n, "model.ckpt") for n in _indexed(storage, directory))


def test_due_saves_are_persisted_and_the_logdir_indexes_only_what_it_holds(backend_logdir, tmp_path):
    storage, logdir, _ = backend_logdir
    state = _state(0)
    with _manager(backend_logdir, tmp_path / "local", max_to_keep=None) as manager:
        for step in range(11):
            manager.save(step, state)
            for name in _indexed(storage, logdir):  # at every point: each listed checkpoint verifies there
                verify_checkpoint(storage.join(logdir, name), storage=storage)
            assert manager.persister.flush(30)
    assert _steps(storage, logdir) == [0, 3, 6, 9, 10]  # the first, every 3 steps, and the final one at close
    assert sorted(os.listdir(tmp_path / "local")) == [".supervisor.lock", "checkpoint", "model.ckpt-10", "model.ckpt-9", "tier-persisted.json"]


def test_restore_takes_the_newer_local_checkpoint_bit_exact(backend_logdir, tmp_path, caplog):
    state = _state(0)
    with _manager(backend_logdir, tmp_path / "local", persist_every_steps=100) as manager:
        manager.save(0, state)
        manager.persister.flush(30)
        with torch.no_grad():
            state.as_dict()["model"].weight.add_(1.0)
        manager.save(5, state)  # local only: not due, and close persists it (below: killed instead)
        expected = {k: v.clone() for k, v in state.as_dict()["model"].state_dict().items()}
        manager.persister.offer = lambda *a, **k: False  # step 5 stays local-only, as after a kill before its copy
    restored_state = _state(1)
    with caplog.at_level(logging.INFO, logger="supervisor.checkpoint.tiers.manager"), \
            _manager(backend_logdir, tmp_path / "local") as manager:
        restored = manager.restore(restored_state)
    assert restored.global_step == 5
    for k, v in restored_state.as_dict()["model"].state_dict().items():
        assert torch.equal(v, expected[k])
    assert f"restored step 5 from the local tier {tmp_path / 'local'} (newer than the logdir's step 0)" in caplog.text


def test_a_wiped_local_tier_falls_back_to_the_logdir(backend_logdir, tmp_path, caplog):
    state = _state(0)
    with _manager(backend_logdir, tmp_path / "local") as manager:
        for step in range(5):
            manager.save(step, state)
    shutil.rmtree(tmp_path / "local")  # the node was replaced
    with caplog.at_level(logging.INFO, logger="supervisor.checkpoint.tiers.manager"), \
            _manager(backend_logdir, tmp_path / "local") as manager:
        restored = manager.restore(_state(1))
    assert restored.global_step == 4  # the final checkpoint was persisted at close
    assert restored.path.startswith(backend_logdir[1])
    assert "restored step 4 from the persistent tier" in caplog.text
    assert "the local tier has no checkpoint (a new or wiped node?)" in caplog.text


def test_a_damaged_local_checkpoint_falls_back_across_tiers(backend_logdir, tmp_path, caplog):
    storage, logdir, _ = backend_logdir
    local = tmp_path / "local"
    state = _state(0)
    with _manager(backend_logdir, local, persist_every_steps=2, local_max_to_keep=1) as manager:
        for step in range(4):
            manager.save(step, state)
            manager.persister.flush(30)
        manager.persister.offer = lambda *a, **k: False  # step 3 stays local-only
    assert _steps(storage, logdir) == [0, 2]
    with open(local / "model.ckpt-3" / "state.pt", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with caplog.at_level(logging.INFO), _manager(backend_logdir, local) as manager:
        restored = manager.restore(_state(1))
        manager.persister.offer = lambda *a, **k: False
    assert restored.global_step == 2
    assert "skipping checkpoint" in caplog.text and "of the local tier (step 3)" in caplog.text
    assert "restored step 2 from the persistent tier" in caplog.text


def test_local_retention_keeps_a_checkpoint_whose_copy_is_in_flight(backend_logdir, tmp_path, monkeypatch):
    storage, logdir, _ = backend_logdir
    gate, started = threading.Event(), threading.Event()
    real = persist.persist_copy

    def gated(*args, **kwargs):
        started.set()
        assert gate.wait(60)
        return real(*args, **kwargs)
    monkeypatch.setattr(persist, "persist_copy", gated)
    local = tmp_path / "local"
    state = _state(0)
    with _manager(backend_logdir, local, local_max_to_keep=1) as manager:
        manager.save(0, state)
        assert started.wait(30)
        manager.save(1, state)
        manager.save(2, state)
        assert sorted(n for n in os.listdir(local) if n.startswith("model")) == ["model.ckpt-0", "model.ckpt-2"]
        gate.set()
        assert manager.persister.flush(30)
        manager.save(3, state)
        assert sorted(n for n in os.listdir(local) if n.startswith("model")) == ["model.ckpt-3"]
    assert _steps(storage, logdir)[0] == 0


def test_a_local_checkpoint_damaged_before_its_copy_is_never_persisted(backend_logdir, tmp_path, monkeypatch, caplog):
    storage, logdir, _ = backend_logdir
    gate, started = threading.Event(), threading.Event()
    real = persist.persist_copy

    def gated(*args, **kwargs):
        started.set()
        assert gate.wait(60)
        return real(*args, **kwargs)
    monkeypatch.setattr(persist, "persist_copy", gated)
    local = tmp_path / "local"
    with _manager(backend_logdir, local, max_consecutive_save_failures=3) as manager:
        manager.save(0, _state(0))
        assert started.wait(30)
        with open(local / "model.ckpt-0" / "state.pt", "r+b") as f:
            f.seek(64)
            f.write(b"\0" * 8)
        with caplog.at_level(logging.WARNING):
            gate.set()
            assert manager.persister.flush(30)
        manager.persister.offer = lambda *a, **k: False
    assert "the local copy is damaged" in caplog.text
    assert _indexed(storage, logdir) == []
    assert supervisor.checkpoint.list_committed(logdir, "model.ckpt", storage) == []


def test_a_failed_copy_is_fatal_by_default(backend_logdir, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(persist, "persist_copy", broken)
    errors = []
    manager = _manager(backend_logdir, tmp_path / "local")
    manager.open()
    manager.on_error = errors.append
    manager.save(0, _state(0))
    manager.persister.flush(30)
    assert len(errors) == 1 and "persisting the checkpoint of step 0" in str(errors[0])
    with pytest.raises(CheckpointError, match="No space left on device"):
        manager.close()


def test_readers_of_the_logdir_see_only_persisted_checkpoints(tmp_path):
    """An evaluator (`checkpoints_iterator`, the sidecar) reads the logdir: the persistent tier."""
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    with TieredCheckpointManager(logdir, local_dir=local, persist_every_steps=3, save_mode="sync") as manager:
        for step in range(5):
            manager.save(step, _state(0))
            manager.persister.flush(30)
        manager.persister.offer = lambda *a, **k: False  # step 4 stays local-only
        seen = list(supervisor.checkpoints_iterator(logdir, timeout=0))
    assert [os.path.basename(p) for p in seen] == ["model.ckpt-3"]
    assert supervisor.latest_checkpoint(local).endswith("model.ckpt-4")


def test_after_close_the_local_tier_holds_max_to_keep_and_nothing_already_persisted(tmp_path, monkeypatch):
    """A slow logdir (the first copy held by a handshake while newer saves commit): the local tier
    holds at most ``local_max_to_keep`` plus the steps not yet persisted — after ``close`` too,
    once the held copy arrived."""
    gate, started = threading.Event(), threading.Event()
    real = persist.persist_copy

    def held(*args, **kwargs):
        started.set()
        assert gate.wait(60)
        return real(*args, **kwargs)
    monkeypatch.setattr(persist, "persist_copy", held)
    logdir, local = str(tmp_path / "logdir"), tmp_path / "local"
    with _manager((None, logdir, None), local, persist_every_steps=10, local_max_to_keep=2) as manager:
        manager.save(0, _state(0))
        assert started.wait(30)
        for step in (1, 2, 3):
            manager.save(step, _state(step))
        assert _local_steps(local) == [0, 2, 3]  # 0's copy is in flight: held
        gate.set()
    assert _steps(None, logdir) == [0, 3]  # the final checkpoint persisted at close
    assert _local_steps(local) == [2, 3]


def _local_steps(local) -> list[int]:
    return sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(local) if n.startswith("model.ckpt-"))
