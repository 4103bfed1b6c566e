"""CheckpointSaverHook on the real checkpoint engine (SPEC §7, §8)."""
from __future__ import annotations

import glob
import os
import re

import pytest
import torch

import hooks
from supervisor import CheckpointManager, MonitoredSession, SessionCreator, TrainingState
from supervisor.testing import FakeClock, InMemorySummaryWriter


def steps_on_disk(logdir):
    return sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(os.path.join(logdir, "model.ckpt-*"))
                  if ".tmp-" not in p)


def creator(**kwargs):
    return SessionCreator(TrainingState({"model": torch.nn.Linear(2, 1)}), **kwargs)


def test_save_secs_schedule_with_its_own_manager(tmp_path):
    clock = FakeClock()
    hook = hooks.CheckpointSaverHook(tmp_path, save_secs=10, clock=clock)
    with MonitoredSession(creator(), hooks=[hook], clock=clock) as s:
        for _ in range(6):
            clock.advance(4)  # steps end at +4, +8, +12, +16, +20, +24 s
            s.run(lambda: None)
    # creation (step 0), +12 s (step 3), +24 s (step 6 = the last step, so no extra end save)
    assert steps_on_disk(tmp_path) == [0, 3, 6]
    # the hook's own manager was closed with the session: the directory's lock is free again
    manager = CheckpointManager(tmp_path)
    manager.open()
    manager.close()


def test_end_save_when_step_changed_and_session_log(tmp_path):
    writer = InMemorySummaryWriter()
    hook = hooks.CheckpointSaverHook(tmp_path, save_steps=4)
    with MonitoredSession(creator(summary_writer=writer), hooks=[hook]) as s:
        for _ in range(5):
            s.run(lambda: None)
    assert steps_on_disk(tmp_path) == [0, 4, 5]
    assert [(e.status, e.step) for e in writer.session_logs] == [("CHECKPOINT", 0), ("CHECKPOINT", 4), ("CHECKPOINT", 5)]
    assert writer.session_logs[-1].checkpoint_path == os.path.join(os.path.abspath(tmp_path), "model.ckpt-5")


def test_no_final_save_after_an_error(tmp_path):
    hook = hooks.CheckpointSaverHook(tmp_path, save_steps=100)
    with pytest.raises(ValueError, match="step failed"):
        with MonitoredSession(creator(), hooks=[hook]) as s:
            s.run(lambda: None)
            s.run(lambda: (_ for _ in ()).throw(ValueError("step failed")))
    assert steps_on_disk(tmp_path) == [0]
    manager = CheckpointManager(tmp_path)
    manager.open()  # lock released on the error path too
    manager.close()


@pytest.mark.parametrize(
    "kwargs, error, text",
    [
        ({"save_secs": 10, "save_steps": 5}, ValueError, "exactly one of save_steps and save_secs must be given"),
        ({}, ValueError, "exactly one of save_steps and save_secs must be given"),
        ({"save_steps": 0}, ValueError, "save_steps must be a positive integer"),
        ({"save_secs": -1}, ValueError, "save_secs must be a positive number"),
        ({"save_steps": 5, "listeners": [object()]}, TypeError, "listeners[0] must be a hooks.CheckpointSaverListener"),
    ],
)
def test_validation(tmp_path, kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        hooks.CheckpointSaverHook(tmp_path, **kwargs)


def test_checkpoint_dir_must_be_a_path():
    with pytest.raises(TypeError, match="checkpoint_dir must be a directory path, got None"):
        hooks.CheckpointSaverHook(None, save_steps=1)


def test_listener_call_order(tmp_path):
    calls = []

    class Recorder(hooks.CheckpointSaverListener):
        def begin(self):
            calls.append("begin")

        def before_save(self, session, step):
            calls.append(("before_save", step))

        def after_save(self, session, step):
            calls.append(("after_save", step))

        def end(self, session, step):
            calls.append(("end", step))

    hook = hooks.CheckpointSaverHook(tmp_path, save_steps=2, listeners=[Recorder()])
    with MonitoredSession(creator(), hooks=[hook]) as s:
        for _ in range(3):
            s.run(lambda: None)
    # after_save comes after the commit, delivered at a later boundary or at close: order per
    # checkpoint is fixed (before_save, then after_save), and every save is delivered before end.
    saved = [c for c in calls if c[0] in ("before_save", "after_save")]
    assert [c for c in saved if c[0] == "before_save"] == [("before_save", 0), ("before_save", 2), ("before_save", 3)]
    assert [c for c in saved if c[0] == "after_save"] == [("after_save", 0), ("after_save", 2), ("after_save", 3)]
    for step in (0, 2, 3):
        assert calls.index(("before_save", step)) < calls.index(("after_save", step))
    assert calls[0] == "begin" and calls[-1] == ("end", 3)


def test_listener_calls_alternate_as_in_tf(tmp_path):
    """Issue 22.3 / SPEC §3.5: a capture that waits for the previous commit delivers that
    commit's after_save first — before_save 0, after_save 0, before_save 1, after_save 1, ..."""
    calls = []

    class Recorder(hooks.CheckpointSaverListener):
        def before_save(self, session, step):
            calls.append(("before_save", step))

        def after_save(self, session, step):
            calls.append(("after_save", step))

    hook = hooks.CheckpointSaverHook(tmp_path, save_steps=1, listeners=[Recorder()])
    with MonitoredSession(creator(), hooks=[hook]) as s:
        for _ in range(2):
            s.run(lambda: None)
    assert calls == [("before_save", 0), ("after_save", 0), ("before_save", 1), ("after_save", 1),
                     ("before_save", 2), ("after_save", 2)]
