"""Verify, then fall back (SPEC §5.4, §15): damage is detected, an older checkpoint is used and the
WARNING says why; when nothing verifies, CheckpointCorruptError lists each checkpoint."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from supervisor.checkpoint import CheckpointManager, verify_checkpoint
from supervisor.errors import CheckpointCorruptError

from .conftest import small_state, train_step


@pytest.fixture
def logdir_with_three(tmp_path, clock):
    """A logdir with committed checkpoints of steps 1, 2, 3 (index names step 3), and the
    model weights after each step."""
    state = small_state()
    weights = {}
    with CheckpointManager(tmp_path / "logdir", clock=clock) as manager:
        for step in (1, 2, 3):
            train_step(state, step)
            weights[step] = {k: v.clone() for k, v in state["model"].state_dict().items()}
            manager.save(step, state, wait=True)
    return tmp_path / "logdir", weights


def _restore(logdir, clock, **kwargs):
    state = small_state(seed=99)
    with CheckpointManager(logdir, clock=clock, **kwargs) as manager:
        restored = manager.restore(state)
    return restored, state


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = [
    ("truncated", lambda c: _truncate(c / "state.pt"), "has"),
    ("flipped byte", lambda c: _flip_byte(c / "state.pt"), "checksum"),
    ("missing manifest", lambda c: os.remove(c / "MANIFEST.json"), "MANIFEST.json is missing"),
    ("deleted state.pt", lambda c: os.remove(c / "state.pt"), "state.pt is missing"),
    ("garbage manifest", lambda c: (c / "MANIFEST.json").write_text("{not json"), "MANIFEST.json is unreadable"),
]


@pytest.mark.parametrize("what, damage, reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(logdir_with_three, clock, caplog, what, damage, reason):
    logdir, weights = logdir_with_three
    damage(logdir / "model.ckpt-3")

    with caplog.at_level(logging.WARNING):
        restored, state = _restore(logdir, clock)

    assert restored.global_step == 2
    assert restored.path == str(logdir / "model.ckpt-2")
    for key, value in weights[2].items():
        assert torch.equal(state["model"].state_dict()[key], value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("model.ckpt-3" in w and reason in w and "trying the next older one" in w for w in warnings), warnings


def test_flipped_byte_passes_size_verification_but_not_full(logdir_with_three):
    logdir, _ = logdir_with_three
    _flip_byte(logdir / "model.ckpt-3" / "state.pt")
    verify_checkpoint(str(logdir / "model.ckpt-3"), "size")
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        verify_checkpoint(str(logdir / "model.ckpt-3"), "full")


def test_index_pointing_at_a_missing_checkpoint_falls_back(logdir_with_three, clock, caplog):
    logdir, _ = logdir_with_three
    (logdir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-9"\n')
    with caplog.at_level(logging.WARNING):
        restored, _ = _restore(logdir, clock)
    assert restored.global_step == 3
    assert any("model.ckpt-9" in r.getMessage() and "does not exist" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("content", ["", "garbage line\n"], ids=["empty", "garbage"])
def test_unreadable_index_restores_the_highest_step_with_a_warning(logdir_with_three, clock, caplog, content):
    logdir, _ = logdir_with_three
    (logdir / "checkpoint").write_text(content)
    with caplog.at_level(logging.WARNING):
        restored, _ = _restore(logdir, clock)
    assert restored.global_step == 3
    assert any("unreadable" in r.getMessage() and "highest-step" in r.getMessage() for r in caplog.records)


def test_missing_index_restores_the_highest_step_with_a_warning(logdir_with_three, clock, caplog):
    logdir, _ = logdir_with_three
    os.remove(logdir / "checkpoint")
    with caplog.at_level(logging.WARNING):
        restored, _ = _restore(logdir, clock)
    assert restored.global_step == 3
    assert any("no checkpoint index" in r.getMessage() and "model.ckpt-3" in r.getMessage() for r in caplog.records)


def test_hand_edited_index_is_honoured(logdir_with_three, clock):
    logdir, weights = logdir_with_three
    text = (logdir / "checkpoint").read_text().replace('model_checkpoint_path: "model.ckpt-3"',
                                                      'model_checkpoint_path: "model.ckpt-1"')
    (logdir / "checkpoint").write_text(text)
    restored, state = _restore(logdir, clock)
    assert restored.global_step == 1
    assert torch.equal(state["model"][0].weight, weights[1]["0.weight"])


def test_rollback_target_damaged_never_jumps_forward(logdir_with_three, clock):
    """The index names step 2 by hand; step 2 is damaged: only older ones (1) are candidates."""
    logdir, _ = logdir_with_three
    (logdir / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-2"\n')
    _truncate(logdir / "model.ckpt-2" / "state.pt")
    restored, _ = _restore(logdir, clock)
    assert restored.global_step == 1


def test_none_verifies_raises_corrupt_error_listing_each(logdir_with_three, clock, caplog):
    logdir, _ = logdir_with_three
    _truncate(logdir / "model.ckpt-3" / "state.pt")
    _flip_byte(logdir / "model.ckpt-2" / "state.pt")
    os.remove(logdir / "model.ckpt-1" / "MANIFEST.json")
    state = small_state(seed=5)
    before = state["model"][0].weight.clone()
    with CheckpointManager(logdir, clock=clock) as manager:
        with pytest.raises(CheckpointCorruptError) as info:
            manager.restore(state)
    message = str(info.value)
    assert "model.ckpt-3" in message and "model.ckpt-2" in message and "model.ckpt-1" in message
    assert "checksum" in message and "MANIFEST.json is missing" in message and "bytes" in message
    assert torch.equal(state["model"][0].weight, before)  # never half-restored from a bad one


def test_verify_size_skips_checksums_but_still_catches_truncation(logdir_with_three, clock):
    logdir, _ = logdir_with_three
    _truncate(logdir / "model.ckpt-3" / "state.pt")
    restored, _ = _restore(logdir, clock, verify="size")
    assert restored.global_step == 2


def test_no_checkpoint_at_all_restores_nothing(tmp_path, clock):
    restored, _ = _restore(tmp_path / "empty", clock)
    assert restored is None
