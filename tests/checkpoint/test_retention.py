"""Retention (SPEC §5.5): TF's rules as pure functions, then the manager applying them on disk."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from supervisor.checkpoint import CheckpointManager, get_checkpoint_state
from supervisor.checkpoint.layout.index import CheckpointState
from supervisor.checkpoint.layout.retention import RetentionState, recover, record, sweep, to_index

from .conftest import small_state

H = 3600.0


def _run(saves, *, max_to_keep, hours, start_preserved=0.0):
    """Applies record+sweep for each (name, time); returns (deleted, preserved, final names)."""
    state = RetentionState((), start_preserved)
    deleted, preserved = [], []
    for name, timestamp in saves:
        result = sweep(record(state, name, timestamp), max_to_keep=max_to_keep,
                       keep_checkpoint_every_n_hours=hours)
        deleted += result.delete
        preserved += result.preserve
        state = result.state
    return deleted, preserved, list(state.names)


HOURLY = [(f"h{k}", k * H) for k in range(1, 7)]

CASES = [
    # id, saves, max_to_keep, keep_every_n_hours, deleted, preserved, managed at the end
    ("keep 2", HOURLY[:5], 2, None, ["h1", "h2", "h3"], [], ["h4", "h5"]),
    ("keep all", HOURLY, None, None, [], [], [f"h{k}" for k in range(1, 7)]),
    ("every 2 hours", HOURLY, 1, 2.0, ["h1", "h3", "h5"], ["h2", "h4"], ["h6"]),
    ("default 10000 hours", HOURLY, 2, 10000.0, ["h1", "h2", "h3", "h4"], [], ["h5", "h6"]),
    ("re-save moves to the end", [("a", 1.0), ("b", 2.0), ("a", 3.0), ("c", 4.0)], 2, None, ["b"], [], ["a", "c"]),
    ("under the limit", HOURLY[:3], 5, None, [], [], ["h1", "h2", "h3"]),
]


@pytest.mark.parametrize("saves, max_to_keep, hours, deleted, preserved, managed",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_sweep_table(saves, max_to_keep, hours, deleted, preserved, managed):
    assert _run(saves, max_to_keep=max_to_keep, hours=hours) == (deleted, preserved, managed)


def test_one_sweep_deletes_every_excess_checkpoint():
    state = RetentionState(tuple((f"c{i}", float(i)) for i in range(6)), 0.0)
    result = sweep(state, max_to_keep=2, keep_checkpoint_every_n_hours=None)
    assert result.delete == ("c0", "c1", "c2", "c3")
    assert result.state.names == ("c4", "c5")


RECOVER_CASES = [
    ("no index", None, 100.0, None, (), 99.0),
    ("preserved ones leave management, future times are clamped",
     CheckpointState("c", ("a", "b", "c"), (10.0, 20.0, 30.0), 15.0), 25.0, None,
     (("b", 20.0), ("c", 25.0)), 15.0),
    ("listed but gone", CheckpointState("c", ("a", "b", "c"), (10.0, 20.0, 30.0), 5.0), 100.0, {"a", "c"},
     (("a", 10.0), ("c", 30.0)), 5.0),
    ("no timestamps (TF1 index): nothing is managed", CheckpointState("b", ("a", "b"), (), 50.0), 100.0, None,
     (), 50.0),
    ("clock went backwards", CheckpointState("a", ("a",), (500.0,), 400.0), 100.0, None, (), 100.0),
]


@pytest.mark.parametrize("index, now, present, managed, last_preserved",
                         [c[1:] for c in RECOVER_CASES], ids=[c[0] for c in RECOVER_CASES])
def test_recover_table(index, now, present, managed, last_preserved):
    state = recover(index, now, present=present)
    assert state.checkpoints == managed
    assert state.last_preserved_timestamp == last_preserved


def test_index_round_trip_of_retention_state():
    state = RetentionState((("model.ckpt-1", 10.5), ("model.ckpt-2", 20.25)), 3.0)
    index = to_index(state, "model.ckpt-2")
    assert index == CheckpointState("model.ckpt-2", ("model.ckpt-1", "model.ckpt-2"), (10.5, 20.25), 3.0)
    assert recover(index, now=100.0) == state


# ---------------------------------------------------------------- on disk
def _steps(logdir):
    return sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(logdir) if n.startswith("model.ckpt-"))


def test_retention_state_survives_a_restart_and_spares_unlisted_checkpoints(tmp_path, clock):
    logdir = tmp_path / "logdir"
    state = small_state()
    with CheckpointManager(logdir, max_to_keep=2, clock=clock) as manager:
        for step in (1, 2, 3):
            clock.advance(10)
            manager.save(step, state, wait=True)
    assert _steps(logdir) == [2, 3]
    shutil.copytree(logdir / "model.ckpt-2", logdir / "model.ckpt-0")  # hand-copied, not listed

    with CheckpointManager(logdir, max_to_keep=2, clock=clock) as manager:
        clock.advance(10)
        manager.save(4, state, wait=True)
    assert _steps(logdir) == [0, 3, 4]  # 2 came from the previous run's history
    assert get_checkpoint_state(logdir).all_model_checkpoint_paths == (
        str(logdir / "model.ckpt-3"), str(logdir / "model.ckpt-4"))


def test_deletion_waits_for_a_newer_commit_then_removes_all_excess(tmp_path, clock):
    logdir = tmp_path / "logdir"
    state = small_state()
    with CheckpointManager(logdir, max_to_keep=5, clock=clock) as manager:
        for step in (1, 2, 3, 4):
            clock.advance(1)
            manager.save(step, state, wait=True)
    with CheckpointManager(logdir, max_to_keep=1, clock=clock) as manager:
        assert manager.restore(small_state(seed=1)).global_step == 4
        assert _steps(logdir) == [1, 2, 3, 4]  # opening and restoring delete nothing
        clock.advance(1)
        manager.save(5, state, wait=True)
    assert _steps(logdir) == [5]


def test_keep_every_n_hours_survives_a_restart(tmp_path, clock):
    logdir = tmp_path / "logdir"
    state = small_state()
    with CheckpointManager(logdir, max_to_keep=1, keep_checkpoint_every_n_hours=1.0, clock=clock) as manager:
        for step in (1, 2):
            clock.advance(H)
            manager.save(step, state, wait=True)
    assert _steps(logdir) == [1, 2]  # 1 preserved for good
    with CheckpointManager(logdir, max_to_keep=1, keep_checkpoint_every_n_hours=1.0, clock=clock) as manager:
        clock.advance(H)
        manager.save(3, state, wait=True)
    # 2 was saved an hour after the preserved 1: kept too. A manager that forgot
    # last_preserved_timestamp would have deleted it (it would count from the restart).
    assert _steps(logdir) == [1, 2, 3]
    assert get_checkpoint_state(logdir).last_preserved_timestamp == clock.time() - H


def test_a_reader_with_the_file_open_survives_its_deletion(tmp_path, clock):
    logdir = tmp_path / "logdir"
    state = small_state()
    with CheckpointManager(logdir, max_to_keep=1, clock=clock) as manager:
        path = manager.save(1, state, wait=True)
        with open(os.path.join(path, "state.pt"), "rb") as reader:
            manager.save(2, state, wait=True)
            assert not os.path.exists(path)
            loaded = torch.load(reader, weights_only=True)
    assert loaded["global_step"] == 1
    assert not [n for n in os.listdir(logdir) if ".deleting-" in n]
