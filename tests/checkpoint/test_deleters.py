"""Every deleter deletes checkpoints only (issue 21 items 2 and 3; SPEC §5.5, §13).

A checkpoint is a directory named ``<basename>-<step>`` (not a symbolic link) holding a committed
``MANIFEST.json`` — one rule, `supervisor.checkpoint.save.commit.deletable_problem`, applied by
retention (`CheckpointManager`), ``prune`` and ``rollback --discard-newer``. Whatever else a
hand-edited index lists (a user's directory, a user's file, an entry that no longer exists, a
FIFO, a symbolic-link loop) is never deleted nor renamed, and ``prune --keep N`` counts and keeps
real, committed checkpoints only — the checkpoint a restart would restore is never deleted.
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

import supervisor
from supervisor.checkpoint.save.commit import deletable_problem, remove_checkpoint
from supervisor.checkpoint.layout.index import CheckpointState, read_index, write_index
from tests.cli.helpers import cli, make_logdir

pytestmark = pytest.mark.timeout(120)


def _plant_user_data(logdir) -> None:
    """A user's directory and file named like checkpoints of another basename, listed in the index."""
    os.makedirs(logdir / "userdata-1")
    (logdir / "userdata-1" / "precious.txt").write_text("keep me")
    (logdir / "notes-3").write_text("my notes")
    index = read_index(str(logdir))
    write_index(str(logdir), CheckpointState(
        index.model_checkpoint_path, ("userdata-1", "notes-3", *index.all_model_checkpoint_paths)))


def _assert_user_data_intact(logdir) -> None:
    assert (logdir / "userdata-1" / "precious.txt").read_text() == "keep me"
    assert (logdir / "notes-3").read_text() == "my notes"
    assert not [n for n in os.listdir(logdir) if ".deleting-" in n]


def _checkpoints(logdir) -> list[str]:
    return sorted(n for n in os.listdir(logdir) if n.startswith("model.ckpt-"))


def test_prune_never_deletes_or_renames_what_is_not_a_checkpoint(tmp_path):
    make_logdir(tmp_path)
    _plant_user_data(tmp_path)
    result = cli("prune", tmp_path, "--keep", "1")
    assert result.returncode == 0, result.stderr
    _assert_user_data_intact(tmp_path)
    assert "deleted notes-3" not in result.stdout and "deleted userdata-1" not in result.stdout
    assert "deleted model.ckpt-100" in result.stdout and "deleted model.ckpt-200" in result.stdout
    assert _checkpoints(tmp_path) == ["model.ckpt-300"]
    # The next trainer start (retention's clean-up) leaves them alone too.
    manager = supervisor.CheckpointManager(str(tmp_path), max_to_keep=1, save_mode="sync")
    manager.open()
    manager.save(400, supervisor.TrainingState.from_arguments(model=torch.nn.Linear(2, 2)))
    manager.close()
    _assert_user_data_intact(tmp_path)


def test_rollback_discard_newer_never_deletes_what_is_not_a_checkpoint(tmp_path):
    make_logdir(tmp_path)
    os.makedirs(tmp_path / "userdata-500")
    (tmp_path / "userdata-500" / "precious.txt").write_text("keep me")
    (tmp_path / "notes-600").write_text("my notes")
    index = read_index(str(tmp_path))
    write_index(str(tmp_path), CheckpointState(index.model_checkpoint_path,
                                               (*index.all_model_checkpoint_paths, "userdata-500", "notes-600")))
    result = cli("rollback", tmp_path, 100, "--discard-newer")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "userdata-500" / "precious.txt").read_text() == "keep me"
    assert (tmp_path / "notes-600").read_text() == "my notes"
    assert _checkpoints(tmp_path) == ["model.ckpt-100"]
    assert not [n for n in os.listdir(tmp_path) if ".deleting-" in n]


def test_retention_never_deletes_a_listed_directory_without_a_manifest(tmp_path):
    make_logdir(tmp_path, steps=(1,))
    os.makedirs(tmp_path / "model.ckpt-0")  # named like a checkpoint, never committed
    (tmp_path / "model.ckpt-0" / "precious.txt").write_text("keep me")
    index = read_index(str(tmp_path))
    stamp = index.all_model_checkpoint_timestamps[0]
    write_index(str(tmp_path), CheckpointState(index.model_checkpoint_path,
                                               ("model.ckpt-0", *index.all_model_checkpoint_paths),
                                               (stamp - 1.0, stamp), index.last_preserved_timestamp))
    manager = supervisor.CheckpointManager(str(tmp_path), max_to_keep=1, save_mode="sync")
    manager.open()
    manager.save(2, supervisor.TrainingState.from_arguments(model=torch.nn.Linear(2, 2)))
    manager.close()
    assert (tmp_path / "model.ckpt-0" / "precious.txt").read_text() == "keep me"
    assert _checkpoints(tmp_path) == ["model.ckpt-0", "model.ckpt-2"]


def test_the_one_rule(tmp_path):
    make_logdir(tmp_path, steps=(1,))
    os.makedirs(tmp_path / "model.ckpt-7")
    os.mkfifo(tmp_path / "model.ckpt-8")
    os.symlink("model.ckpt-9", tmp_path / "model.ckpt-9")  # a loop
    os.symlink("model.ckpt-1", tmp_path / "model.ckpt-10")
    (tmp_path / "notes-3").write_text("x")
    assert deletable_problem(str(tmp_path), "model.ckpt-1", "model.ckpt") is None
    for name, why in [("model.ckpt-7", "no committed MANIFEST.json"), ("model.ckpt-8", "not a directory"),
                      ("model.ckpt-9", "symbolic link"), ("model.ckpt-10", "symbolic link"),
                      ("notes-3", "not a checkpoint name"), ("model.ckpt-11", "does not exist"),
                      ("../model.ckpt-1", "not directly inside")]:
        assert why in deletable_problem(str(tmp_path), name, "model.ckpt"), name
    assert not remove_checkpoint(str(tmp_path / "model.ckpt-7"))
    assert os.path.isdir(tmp_path / "model.ckpt-7") and os.path.islink(tmp_path / "model.ckpt-10")


@pytest.mark.parametrize("newest", ["removed", "fifo", "symlink-loop"])
def test_prune_keeps_a_real_checkpoint_when_the_newest_index_entry_is_not_one(tmp_path, newest):
    make_logdir(tmp_path)  # 100, 200, 300; the index names 300
    shutil.rmtree(tmp_path / "model.ckpt-300")
    if newest == "fifo":
        os.mkfifo(tmp_path / "model.ckpt-300")
    elif newest == "symlink-loop":
        os.symlink("model.ckpt-300", tmp_path / "model.ckpt-300")
    result = cli("prune", tmp_path, "--keep", "1")
    assert result.returncode == 0, result.stderr
    assert os.path.isfile(tmp_path / "model.ckpt-200" / "MANIFEST.json")  # the newest real one stays
    assert "deleted model.ckpt-100" in result.stdout and "deleted model.ckpt-200" not in result.stdout
    assert os.path.lexists(tmp_path / "model.ckpt-300") == (newest != "removed")  # never touched
    with supervisor.MonitoredTrainingSession(str(tmp_path), model=torch.nn.Sequential(
            torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), save_checkpoint_secs=None,
            save_summaries_steps=None, log_step_count_steps=None) as s:
        assert s.global_step == 200


def test_prune_never_deletes_the_checkpoint_a_restart_restores(tmp_path):
    make_logdir(tmp_path)
    with open(tmp_path / "model.ckpt-300" / "state.pt", "r+b") as f:  # the newest fails verification
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    result = cli("prune", tmp_path, "--keep", "1")
    assert result.returncode == 0, result.stderr
    assert _checkpoints(tmp_path) == ["model.ckpt-200", "model.ckpt-300"]  # 200: what a restart restores
    assert "deleted model.ckpt-100" in result.stdout


def test_prune_keep_0_stays_refused(tmp_path):
    make_logdir(tmp_path)
    assert cli("prune", tmp_path, "--keep", "0").returncode == 2
    assert _checkpoints(tmp_path) == ["model.ckpt-100", "model.ckpt-200", "model.ckpt-300"]
