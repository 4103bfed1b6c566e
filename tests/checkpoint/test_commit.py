"""The commit protocol's visible result (SPEC §5.1): layout, manifest, a state.pt anyone can load."""
from __future__ import annotations

import json
import logging
import os
import zlib

import pytest
import torch

from supervisor.checkpoint import latest_checkpoint
from supervisor.errors import CheckpointError
from supervisor.checkpoint.storage.fileio import ChecksumWriter, checksum_file, default_opener

from .conftest import small_state, train_step


def test_committed_checkpoint_layout_and_manifest(manager_factory, clock, tmp_path):
    state = small_state()
    manager = manager_factory()
    train_step(state, 1)
    path = manager.save(7, state, wait=True)

    logdir = tmp_path / "logdir"
    assert path == str(logdir / "model.ckpt-7")
    assert sorted(os.listdir(path)) == ["MANIFEST.json", "state.pt"]
    assert not [n for n in os.listdir(logdir) if ".tmp-" in n]
    manifest = json.loads((logdir / "model.ckpt-7" / "MANIFEST.json").read_text())
    assert manifest["format_version"] == 1
    assert manifest["step"] == 7
    assert manifest["wall_time"] == clock.time()
    assert manifest["torch_version"] == torch.__version__
    assert manifest["world_size"] == 1
    size, checksum = checksum_file(os.path.join(path, "state.pt"))
    assert manifest["files"] == {"state.pt": {"bytes": size, "checksum": checksum}}
    assert latest_checkpoint(logdir) == path
    assert (logdir / "checkpoint").read_text().startswith('model_checkpoint_path: "model.ckpt-7"\n')


def test_state_pt_loads_by_hand_with_weights_only(manager_factory):
    state = small_state()
    train_step(state, 1)
    manager = manager_factory()
    path = manager.save(3, state, wait=True)

    saved = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    assert saved["global_step"] == 3
    assert set(saved) >= {"model", "optimizer", "rng", "global_step"}
    for key, value in state["model"].state_dict().items():
        assert torch.equal(saved["model"][key], value)
    assert saved["optimizer"]["state"][0]["exp_avg"].shape == state["model"][0].weight.shape


def test_open_removes_leftover_temp_directories_with_a_warning(tmp_path, manager_factory, caplog):
    logdir = tmp_path / "logdir"
    leftover = logdir / ("model.ckpt-5.tmp-" + "ab" * 16)
    leftover.mkdir(parents=True)
    (leftover / "state.pt").write_bytes(b"half a checkpoint")
    unrelated = logdir / "notes.tmp-mine"  # not ours: left alone
    unrelated.mkdir()

    with caplog.at_level(logging.WARNING):
        manager_factory()

    assert not leftover.exists()
    assert unrelated.exists()
    assert any("model.ckpt-5.tmp-" in r.getMessage() and "interrupted" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_saving_the_same_step_again_replaces_it_whole(manager_factory):
    state = small_state()
    manager = manager_factory()
    manager.save(4, state, wait=True)
    train_step(state, 1)
    path = manager.save(4, state, wait=True)

    saved = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    assert torch.equal(saved["model"]["0.weight"], state["model"][0].weight)
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith("model.ckpt")] == ["model.ckpt-4"]


def test_checksum_writer_matches_a_second_read(tmp_path):
    path = str(tmp_path / "blob")
    big = torch.arange(3 * 2**20, dtype=torch.uint8)  # > pipelining threshold
    with ChecksumWriter(default_opener(path)) as writer:
        writer.write(b"header")
        writer.write(big.numpy())
        writer.write(memoryview(b"tail" * 10))
        writer.sync()
    data = open(path, "rb").read()
    assert writer.nbytes == len(data) == 6 + 3 * 2**20 + 40
    assert writer.checksum == f"crc32:{zlib.crc32(data):08x}" == checksum_file(path)[1]


def test_staging_buffers_are_reused_between_saves(manager_factory):
    state = small_state(width=64)
    train_step(state, 0)  # Adam's moments exist from the first step on
    manager = manager_factory()
    manager.save(1, state)
    manager.wait()
    first = {id(b) for b in manager._staging._buffers.values()}
    held = manager._staging.nbytes
    for step in range(2, 6):
        train_step(state, step)
        manager.save(step, state, wait=step == 3)  # a waited-for save in between keeps them too
        manager.wait()
    assert {id(b) for b in manager._staging._buffers.values()} == first
    assert manager._staging.nbytes == held
    # one copy of the state: parameters + Adam's two moments (and its step counters)
    params = sum(p.numel() * 4 for p in state["model"].parameters())
    assert 3 * params <= held <= 3 * params + 1024


def test_a_save_the_caller_waits_for_writes_the_live_tensors_without_staging(manager_factory, tmp_path):
    import torch

    state = small_state(width=64)
    train_step(state, 0)
    manager = manager_factory()
    path = manager.save(1, state, wait=True)
    assert manager._staging.nbytes == 0  # no copy: the caller was blocked until the commit
    saved = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    for name, tensor in state["model"].state_dict().items():
        assert torch.equal(saved["model"][name], tensor), name


def test_no_final_directory_and_no_index_until_sealed(manager_factory, tmp_path):
    """An injected failure while writing state.pt leaves neither the final directory nor an index."""
    from .conftest import FaultyOpener

    manager = manager_factory(opener=FaultyOpener(fail_steps={1}), save_mode="sync")
    with pytest.raises(CheckpointError, match="No space left"):
        manager.save(1, small_state())
    logdir = tmp_path / "logdir"
    assert sorted(os.listdir(logdir)) == [".supervisor.lock", ".supervisor.lock.owner"]


def test_opening_a_manager_reads_the_index_once(manager_factory, monkeypatch):
    from supervisor.checkpoint.save import publish as manager_module  # the manager's Publisher reads it

    state = small_state(width=8)
    first = manager_factory()
    first.save(1, state, wait=True)
    first.close()
    reads = []
    real = manager_module.read_index
    monkeypatch.setattr(manager_module, "read_index", lambda d, **kw: reads.append(d) or real(d, **kw))
    manager_factory().open()
    assert len(reads) == 1
