"""The tier arguments are checked at the front door's construction, naming the value and the fix;
the persist schedule and retention's hold are pure functions, driven by tables."""
from __future__ import annotations

import pytest
import torch

import supervisor
from supervisor.checkpoint.layout import retention
from supervisor.checkpoint.tiers.persist import is_due
from supervisor.checkpoint.tiers.options import check_tiers


def test_defaults_every_600_secs_when_no_interval_is_given(tmp_path):
    tiers = check_tiers(local_dir=str(tmp_path / "local"), logdir=str(tmp_path / "logdir"))
    assert tiers == {"local_dir": str(tmp_path / "local"), "persist_every_steps": None, "persist_every_secs": 600.0,
                     "local_max_to_keep": 2, "persist_grace_secs": 120.0}


@pytest.mark.parametrize("kwargs, match", [
    ({"local_dir": "s3://bucket/run"}, "node-local path.*put the URL there"),
    ({"local_dir": "{logdir}"}, "separate directories"),
    ({"local_dir": "{logdir}/fast"}, "separate directories"),
    ({"local_dir": "{tmp}"}, "separate directories"),
    ({"local_dir": "{tmp}/l", "persist_every_steps": 5, "persist_every_secs": 60}, "not both"),
    ({"local_dir": None, "persist_every_steps": 5}, "without local_dir"),
    ({"local_dir": "{tmp}/l", "persist_every_steps": 0}, "persist_every_steps"),
    ({"local_dir": "{tmp}/l", "local_max_to_keep": 0}, "local_max_to_keep"),
    ({"local_dir": "{tmp}/l", "persist_grace_secs": -1}, "persist_grace_secs"),
])
def test_bad_tier_arguments_are_refused_at_construction(tmp_path, kwargs, match):
    logdir = str(tmp_path / "logdir")
    kwargs = {k: v.format(logdir=logdir, tmp=tmp_path) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        supervisor.MonitoredTrainingSession(logdir, torch.nn.Linear(1, 1), save_summaries_steps=None,
                                            log_step_count_steps=None, **kwargs)


def test_a_file_as_local_dir_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        supervisor.Supervisor(str(tmp_path / "logdir"), torch.nn.Linear(1, 1), local_dir=str(tmp_path / "file"))


def test_sharded_checkpoints_take_tiers_at_the_front_door(tmp_path):
    # Refused before issue 33; now a ShardedTieredCheckpointManager (tests/tiers/test_tier_sharded*.py).
    model = torch.nn.Linear(1, 1)
    with supervisor.MonitoredTrainingSession(str(tmp_path / "logdir"), model, checkpoint_format="dcp",
                                             local_dir=str(tmp_path / "local"), save_summaries_steps=None,
                                             log_step_count_steps=None, save_checkpoint_steps=1) as s:
        assert type(s.checkpoint_manager).__name__ == "ShardedTieredCheckpointManager"
        s.run(lambda: None)
    assert (tmp_path / "local" / "rank-0" / "model.ckpt-0.all-ranks").exists()
    assert supervisor.latest_checkpoint(str(tmp_path / "logdir")) is not None  # the final one, persisted at close


@pytest.mark.parametrize("step, now, last_step, last_time, steps, secs, due", [
    (0, 0.0, None, 0.0, 10, None, True),       # the first local checkpoint always
    (5, 0.0, 0, 0.0, 10, None, False),
    (10, 0.0, 0, 0.0, 10, None, True),
    (13, 0.0, 2, 0.0, 10, None, True),         # counted from the last one scheduled, not multiples
    (10, 0.0, 10, 0.0, 10, None, False),       # already scheduled
    (7, 59.0, 3, 0.0, None, 60.0, False),
    (7, 60.0, 3, 0.0, None, 60.0, True),
    (3, 99.0, 3, 0.0, None, 60.0, False),      # never the same step twice
])
def test_the_persist_schedule(step, now, last_step, last_time, steps, secs, due):
    assert is_due(step, now, last_step=last_step, last_time=last_time, every_steps=steps, every_secs=secs) is due


def test_retention_holds_a_checkpoint_whose_copy_is_in_flight():
    state = retention.recover(None, now=0.0)
    for step in (1, 2, 3):
        state = retention.record(state, f"m-{step}", float(step))
    result = retention.sweep(state, max_to_keep=1, keep_checkpoint_every_n_hours=None)
    assert result.delete == ("m-1", "m-2")
    held = retention.hold(result, state, {"m-1"})
    assert held.delete == ("m-2",)
    assert held.state.names == ("m-1", "m-3")  # still managed: deleted by a later sweep
    later = retention.sweep(retention.record(held.state, "m-4", 4.0), max_to_keep=1, keep_checkpoint_every_n_hours=None)
    assert later.delete == ("m-1", "m-3")
