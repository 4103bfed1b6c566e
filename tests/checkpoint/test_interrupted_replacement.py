"""A crash between the two renames of a same-step re-save (or retention's move-aside and its
index rewrite) leaves the indexed checkpoint only under a transient name: `open()` puts the
newest verifying copy back instead of deleting it (SPEC §5.1: a crash at any point leaves the
previous committed checkpoint and the index intact)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from supervisor import CheckpointManager, TrainingState
from supervisor.checkpoint.layout.format import deleting_name, temp_name


def commit_step(logdir, step, value):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    manager = CheckpointManager(logdir, max_to_keep=1)
    manager.open()
    manager.save(step, TrainingState({"model": model}), wait=True)
    manager.close()


def restore(logdir):
    model = torch.nn.Linear(2, 2)
    manager = CheckpointManager(logdir)
    manager.open()
    try:
        restored = manager.restore(TrainingState({"model": model}))
    finally:
        manager.close()
    return restored, model.weight[0, 0].item()


def test_moved_aside_copy_is_put_back(tmp_path, caplog):
    commit_step(tmp_path, 5, 1.0)
    os.rename(tmp_path / "model.ckpt-5", tmp_path / deleting_name("model.ckpt-5"))
    restored, value = restore(tmp_path)
    assert restored.global_step == 5 and value == 1.0
    assert "recovered model.ckpt-5 from model.ckpt-5.deleting-" in caplog.text
    assert sorted(n for n in os.listdir(tmp_path) if not n.startswith(".")) == ["checkpoint", "model.ckpt-5"]


def test_sealed_new_copy_wins_over_the_moved_aside_old_one(tmp_path, caplog):
    commit_step(tmp_path, 5, 1.0)
    old = tmp_path / deleting_name("model.ckpt-5")
    os.rename(tmp_path / "model.ckpt-5", old)
    commit_step(tmp_path / "other", 5, 2.0)  # a sealed save of the same step with new values
    shutil.move(str(tmp_path / "other" / "model.ckpt-5"), str(tmp_path / temp_name("model.ckpt-5")))
    restored, value = restore(tmp_path)
    assert restored.global_step == 5 and value == 2.0
    assert "recovered model.ckpt-5 from model.ckpt-5.tmp-" in caplog.text
    assert not old.exists()  # the older copy was cleaned up afterwards


def test_damaged_leftover_is_not_put_back(tmp_path, caplog):
    commit_step(tmp_path, 5, 1.0)
    aside = tmp_path / deleting_name("model.ckpt-5")
    os.rename(tmp_path / "model.ckpt-5", aside)
    with open(aside / "state.pt", "r+b") as f:  # half-deleted / torn
        f.truncate(10)
    from supervisor import CheckpointCorruptError, CheckpointNotFoundError

    with pytest.raises((CheckpointCorruptError, CheckpointNotFoundError)):
        restore(tmp_path)
    assert "cannot recover model.ckpt-5" in caplog.text
    assert not aside.exists()


def test_unindexed_temp_is_removed_not_recovered(tmp_path):
    commit_step(tmp_path, 5, 1.0)
    commit_step(tmp_path / "other", 9, 2.0)
    shutil.move(str(tmp_path / "other" / "model.ckpt-9"), str(tmp_path / temp_name("model.ckpt-9")))
    restored, value = restore(tmp_path)
    assert restored.global_step == 5 and value == 1.0
    assert not any(".tmp-" in n for n in os.listdir(tmp_path))
