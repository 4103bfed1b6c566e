"""The checkpoint arguments the front doors share become one frozen record, `CheckpointOptions`,
checked at construction and read by attribute (issue 32: before, an untyped dict splatted with
``**options`` and mutated by `Supervisor` after its first session)."""
from __future__ import annotations

import dataclasses

import pytest

from supervisor.frontdoors.checkpoint_arguments import CheckpointOptions, check_checkpoint_options

pytestmark = pytest.mark.timeout(60)


def _check(tmp_path, **kwargs) -> CheckpointOptions:
    arguments = {"basename": "model.ckpt", "max_to_keep": 3, "keep_checkpoint_every_n_hours": 1.0,
                 "save_mode": "sync", "logdir": str(tmp_path / "run")} | kwargs
    return check_checkpoint_options(**arguments)


def test_the_options_are_a_frozen_record_read_by_attribute(tmp_path):
    options = _check(tmp_path, restore_step=2, trusted_globals=[dict], local_dir=str(tmp_path / "local"))
    assert (options.max_to_keep, options.save_mode, options.lock, options.restore_step) == (3, "sync", "auto", 2)
    assert options.trusted_globals == (dict,) and options.persist_every_secs == 600.0  # resolved, not as given
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_to_keep = 4  # type: ignore[misc]
    first_only = options.after_first_session()
    assert first_only.restore_step is None and options.restore_step == 2  # a new record; the old one unchanged


@pytest.mark.parametrize("kwargs, text", [
    ({"max_to_keep": 0}, "max_to_keep must be a positive integer or None, got 0"),
    ({"save_mode": "later"}, "save_mode must be one of 'async', 'sync', got 'later'"),
    ({"basename": "a/b"}, "checkpoint_basename must be a plain file name such as 'model.ckpt', got 'a/b'"),
    ({"persist_every_steps": 5}, "persist_every_steps/persist_every_secs were given without local_dir"),
])
def test_a_bad_argument_is_named_at_construction(tmp_path, kwargs, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        _check(tmp_path, **kwargs)


@pytest.mark.parametrize("kwargs, text", [
    ({"keep_best": 2, "best_metric": "loss"}, "keep_best=2, best_metric='loss' is not supported with checkpoint_format='dcp'"),
])
def test_what_sharded_checkpoints_do_not_take_is_refused_by_the_record(tmp_path, kwargs, text):
    with pytest.raises(ValueError, match=text):
        _check(tmp_path, **kwargs).check_sharded()
    _check(tmp_path).check_sharded()  # the defaults pass
    _check(tmp_path, restore_step=4).check_sharded()  # a chosen step restores sharded checkpoints too


def test_the_front_doors_clock_travels_in_the_record_to_the_manager(tmp_path):
    """The clock is resolved once into the record (no function between the front door and the
    manager takes it beside the record): a save's timestamp in the index is the fake clock's."""
    import torch

    from supervisor import MonitoredTrainingSession, get_checkpoint_state
    from supervisor.testing import FakeClock

    clock = FakeClock(start_secs=1_234_567.0)
    assert _check(tmp_path, clock=clock).clock is clock
    assert _check(tmp_path).clock is not None  # the system clock, resolved
    with pytest.raises(TypeError, match="clock must provide time"):
        _check(tmp_path, clock=object())
    model = torch.nn.Linear(2, 1)
    with MonitoredTrainingSession(str(tmp_path / "run"), model=model, clock=clock, save_checkpoint_steps=1,
                                  save_summaries_steps=None, log_step_count_steps=None, handle_signals=False) as s:
        s.run(lambda: None)
    assert set(get_checkpoint_state(str(tmp_path / "run")).all_model_checkpoint_timestamps) == {1_234_567.0}
