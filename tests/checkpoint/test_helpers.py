"""Public helpers (SPEC §4, §5.3, §5.8): index reading, load_checkpoint, restore_partial,
checkpoints_iterator."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import (
    CheckpointState,
    checkpoints_iterator,
    get_checkpoint_state,
    latest_checkpoint,
    load_checkpoint,
    restore_partial,
)
from supervisor.checkpoint.layout.index import format_index, parse_index
from supervisor.errors import CheckpointError, CheckpointNotFoundError
from supervisor.testing import FakeClock

from .conftest import small_state


# ---------------------------------------------------------------- index
def test_index_text_format_round_trip_and_tf_compatibility():
    text = ('model_checkpoint_path: "model.ckpt-200"\n'
            'all_model_checkpoint_paths: "model.ckpt-100"\n'
            'all_model_checkpoint_paths: "model.ckpt-200"\n'
            "all_model_checkpoint_timestamps: 1763700000.5\n"
            "all_model_checkpoint_timestamps: 1763700600.1\n"
            "last_preserved_timestamp: 1763699000.0\n")
    state = parse_index(text)
    assert state == CheckpointState("model.ckpt-200", ("model.ckpt-100", "model.ckpt-200"),
                                    (1763700000.5, 1763700600.1), 1763699000.0)
    assert format_index(state) == text
    weird = CheckpointState('dir with "quotes"\\and slash')
    assert parse_index(format_index(weird)) == weird


def test_get_checkpoint_state_and_latest_checkpoint_mirror_tf(manager_factory, tmp_path, caplog):
    logdir = tmp_path / "logdir"
    assert get_checkpoint_state(logdir) is None and latest_checkpoint(logdir) is None
    manager = manager_factory()
    for step in (1, 2):
        manager.save(step, small_state(), wait=True)
    state = get_checkpoint_state(logdir)
    assert state.model_checkpoint_path == str(logdir / "model.ckpt-2")  # absolute, like TF
    assert state.all_model_checkpoint_paths == (str(logdir / "model.ckpt-1"), str(logdir / "model.ckpt-2"))
    assert latest_checkpoint(str(logdir)) == str(logdir / "model.ckpt-2")

    (logdir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-5"\n')
    assert latest_checkpoint(logdir) is None  # names a checkpoint that does not exist
    (logdir / "checkpoint").write_text("nonsense\n")
    with caplog.at_level(logging.WARNING):
        assert get_checkpoint_state(logdir) is None
    assert "unreadable" in caplog.text


# ---------------------------------------------------------------- load_checkpoint
def test_load_checkpoint_returns_the_saved_mapping(manager_factory, tmp_path):
    path = manager_factory().save(4, small_state(), wait=True)
    saved = load_checkpoint(path)
    assert saved["global_step"] == 4 and {"model", "optimizer", "rng"} <= set(saved)
    with pytest.raises(CheckpointNotFoundError):
        load_checkpoint(tmp_path / "logdir" / "model.ckpt-99")
    plain = tmp_path / "pretrained.pt"
    torch.save({"w": torch.ones(2)}, plain)
    assert torch.equal(load_checkpoint(plain)["w"], torch.ones(2))  # a bare torch.save file


# ---------------------------------------------------------------- restore_partial
class _Backbone(torch.nn.Module):
    def __init__(self, classes: int, hidden: int = 4) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(3, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, classes)


def test_restore_partial_loads_what_fits_and_reports_the_rest(manager_factory):
    torch.manual_seed(0)
    source = _Backbone(classes=10)
    source.extra = torch.nn.Linear(1, 1)  # only in the checkpoint
    path = manager_factory().save(1, TrainingState({"model": source}), wait=True)
    torch.manual_seed(1)
    target = _Backbone(classes=3)
    target.adapter = torch.nn.Linear(2, 2)  # only in the target
    head_before = target.head.weight.clone()

    report = restore_partial(path, target, exclude="norm.*")

    assert set(report.loaded) == {"encoder.weight", "encoder.bias"}
    assert report.skipped == {
        "norm.weight": "matched by exclude", "norm.bias": "matched by exclude",
        "head.weight": "shape (10, 4) in the checkpoint, (3, 4) in the target",
        "head.bias": "shape (10,) in the checkpoint, (3,) in the target",
        "extra.weight": "not in the target", "extra.bias": "not in the target",
    }
    assert set(report.missing) == {"adapter.weight", "adapter.bias"}
    assert torch.equal(target.encoder.weight, source.encoder.weight)
    assert torch.equal(target.head.weight, head_before)
    assert "loaded 2 key(s)" in str(report)


def test_restore_partial_include_strict_and_wrapped_targets(manager_factory):
    source = _Backbone(classes=2)
    path = manager_factory().save(1, TrainingState({"model": torch.nn.DataParallel(source)}), wait=True)

    target = _Backbone(classes=2)
    report = restore_partial(path, torch.compile(target), include=["encoder.*", "head.*"])
    assert set(report.loaded) == {"encoder.weight", "encoder.bias", "head.weight", "head.bias"}
    assert report.skipped == {"norm.weight": "not matched by include", "norm.bias": "not matched by include"}

    wrong = _Backbone(classes=5)
    before = wrong.encoder.weight.clone()
    with pytest.raises(CheckpointError, match="head.weight"):
        restore_partial(path, wrong, strict=True)
    assert torch.equal(wrong.encoder.weight, before)  # strict: nothing loaded

    with pytest.raises(CheckpointError, match="no entry 'teacher'"):
        restore_partial(path, target, entry="teacher")


def test_restore_partial_from_a_plain_state_dict_file(tmp_path):
    source = _Backbone(classes=2)
    torch.save(source.state_dict(), tmp_path / "weights.pt")
    target = _Backbone(classes=2)
    report = restore_partial(tmp_path / "weights.pt", target)
    assert len(report.loaded) == 6 and not report.skipped
    assert torch.equal(target.head.weight, source.head.weight)


# ---------------------------------------------------------------- checkpoints_iterator
def test_checkpoints_iterator_yields_each_new_verified_checkpoint(manager_factory, tmp_path, caplog):
    logdir = tmp_path / "logdir"
    clock = FakeClock()
    manager = manager_factory(max_to_keep=None)
    state = small_state()
    manager.save(1, state, wait=True)
    iterator = checkpoints_iterator(logdir, timeout=30, poll_secs=10, clock=clock)

    assert next(iterator) == str(logdir / "model.ckpt-1")
    manager.save(2, state, wait=True)
    manager.save(3, state, wait=True)  # 2 was superseded before we looked: skipped, like TF
    assert next(iterator) == str(logdir / "model.ckpt-3")

    manager.save(4, state, wait=True)
    with open(logdir / "model.ckpt-4" / "state.pt", "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    start = clock.monotonic()
    with caplog.at_level(logging.WARNING):
        with pytest.raises(StopIteration):
            next(iterator)  # 4 never verifies: waited past, then the timeout ends the iteration
    assert "not yielding" in caplog.text and "model.ckpt-4" in caplog.text
    assert clock.monotonic() - start == 30


def test_checkpoints_iterator_min_interval_and_timeout_fn(manager_factory, tmp_path):
    logdir = tmp_path / "logdir"
    clock = FakeClock()
    manager = manager_factory()
    manager.save(1, small_state(), wait=True)
    answers = [False, True]
    asked = []

    def timeout_fn():
        asked.append(clock.monotonic())
        return answers.pop(0)

    iterator = checkpoints_iterator(logdir, min_interval_secs=100, timeout=20, timeout_fn=timeout_fn,
                                    poll_secs=5, clock=clock)
    start = clock.monotonic()
    assert next(iterator).endswith("model.ckpt-1")
    with pytest.raises(StopIteration):
        next(iterator)
    # the min interval (100 s) first, then two timeouts of 20 s, asking timeout_fn after each
    assert [t - start for t in asked] == [120, 140]


def test_checkpoints_iterator_waits_for_a_directory_that_does_not_exist_yet(tmp_path):
    clock = FakeClock()
    assert list(checkpoints_iterator(tmp_path / "later", timeout=3, poll_secs=1, clock=clock)) == []
    assert not os.path.exists(tmp_path / "later")
