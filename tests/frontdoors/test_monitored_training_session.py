"""MonitoredTrainingSession scenarios (SPEC §7, §9), after TF's monitored_session_test.py."""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import hooks
from supervisor import MonitoredTrainingSession, RecoverableError, SingularMonitoredSession, latest_checkpoint
from supervisor.testing import FakeClock, RecordingHook


def make_model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def trainer(model, opt):
    x = torch.arange(12.0).reshape(4, 3) / 10

    def train_step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    return train_step


def steps_on_disk(logdir):
    return sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(os.path.join(logdir, "model.ckpt-*"))
                  if ".tmp-" not in p)


def test_chief_hook_order(tmp_path):
    chief, user = RecordingHook(name="chief"), RecordingHook(name="user")
    with MonitoredTrainingSession(tmp_path, *make_model(), hooks=[user], chief_only_hooks=[chief]) as s:
        kinds = [type(h) for h in s.hooks]
    assert kinds == [RecordingHook, hooks.StepCounterHook, hooks.SummarySaverHook,
                     hooks.CheckpointSaverHook, RecordingHook]
    assert s.hooks[0] is chief and s.hooks[-1] is user


def test_save_at_creation_on_schedule_and_at_end(tmp_path):
    model, opt = make_model()
    with MonitoredTrainingSession(tmp_path, model, opt, save_checkpoint_steps=3) as s:
        for _ in range(7):
            s.run(trainer(model, opt))
    assert steps_on_disk(tmp_path) == [0, 3, 6, 7]
    assert latest_checkpoint(tmp_path).endswith("model.ckpt-7")


def test_restored_session_does_not_rewrite_the_checkpoint_it_came_from(tmp_path):
    model, opt = make_model()
    with MonitoredTrainingSession(tmp_path, model, opt, save_checkpoint_steps=100) as s:
        for _ in range(4):
            s.run(trainer(model, opt))
    manifest = os.path.join(tmp_path, "model.ckpt-4", "MANIFEST.json")
    before = json.load(open(manifest))
    with MonitoredTrainingSession(tmp_path, model, opt, save_checkpoint_steps=100) as s:
        assert s.global_step == 4
    assert json.load(open(manifest)) == before  # not rewritten at creation nor at end
    assert steps_on_disk(tmp_path) == [0, 4]


def test_recoverable_error_restores_latest_checkpoint_and_retries(tmp_path):
    model, opt = make_model()
    train = trainer(model, opt)
    failed = []

    def flaky_step():
        if len(failed) == 0 and s.global_step == 3:
            failed.append(model.weight.detach().clone())
            raise RecoverableError("collective timed out")
        return train()

    rec = RecordingHook()
    with MonitoredTrainingSession(tmp_path, model, opt, save_checkpoint_steps=2, hooks=[rec], clock=FakeClock()) as s:
        runs = 0
        while s.global_step < 4:
            s.run(flaky_step)
            runs += 1
            if s.global_step == 2:
                weights_at_2 = model.weight.detach().clone()
    assert runs == 5  # the failed run's retry went back to step 2 and replayed step 3
    # re-created from model.ckpt-2: steps 3 and 4 were replayed from step 2's weights
    assert rec.calls.count("after_create_session") == 2 and rec.calls.count("begin") == 1
    reference, ref_opt = make_model()
    ref_train = trainer(reference, ref_opt)
    for _ in range(4):
        ref_train()
    assert torch.equal(model.weight, reference.weight)
    assert not torch.equal(weights_at_2, reference.weight)


def test_summaries_and_step_rate_in_tensorboard(tmp_path):
    model, opt = make_model()
    with MonitoredTrainingSession(tmp_path, model, opt, save_summaries_steps=2, log_step_count_steps=2) as s:
        for _ in range(6):
            s.run(trainer(model, opt))
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 3, 5, 6]  # 6: the final summary at close
    assert [e.step for e in acc.Scalars("global_step/sec")] == [3, 5]
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1


def test_listener_stop_request_ignored_at_creation_honoured_after(tmp_path):
    saves = []

    class StopAfterSecondSave(hooks.CheckpointSaverListener):
        def after_save(self, session, global_step_value):
            saves.append(global_step_value)
            assert os.path.isdir(os.path.join(tmp_path, f"model.ckpt-{global_step_value}"))  # committed
            return True

    model, opt = make_model()
    listener_hook = hooks.CheckpointSaverHook(tmp_path, save_steps=2, listeners=[StopAfterSecondSave()])
    with MonitoredTrainingSession(tmp_path, model, opt, save_checkpoint_secs=None, hooks=[listener_hook]) as s:
        while not s.should_stop():
            s.run(trainer(model, opt))
    # The stop asked at creation was ignored; the one after step 2's commit stopped training
    # at the first boundary after the commit was delivered (saves stay asynchronous, §3.5).
    assert saves[:2] == [0, 2]
    assert "StopAfterSecondSave.after_save returned True after the checkpoint of step 2" in s.stop_reason
    assert 2 < s.global_step < 50 and saves[-1] == s.global_step  # the final checkpoint was delivered too


def test_worker_waits_for_the_chief_checkpoint_then_times_out(tmp_path):
    with pytest.raises(TimeoutError, match=str(tmp_path)):
        MonitoredTrainingSession(tmp_path, *make_model(), is_chief=False, max_wait_secs=0)
    assert os.listdir(tmp_path) == [] if os.path.isdir(tmp_path) else True


def test_worker_restores_the_chief_checkpoint(tmp_path):
    model, opt = make_model()
    with MonitoredTrainingSession(tmp_path, model, opt) as s:
        s.run(trainer(model, opt))
    worker, worker_opt = make_model(seed=5)
    with MonitoredTrainingSession(tmp_path, worker, worker_opt, is_chief=False) as s:
        assert s.global_step == 1 and torch.equal(worker.weight, model.weight)


def test_singular_session_saves_and_exposes_raw_state(tmp_path):
    model, opt = make_model()
    with SingularMonitoredSession(tmp_path, model, opt, save_checkpoint_steps=2) as s:
        assert s.raw_state()["model"] is model
        for _ in range(3):
            s.run(trainer(model, opt))
    assert steps_on_disk(tmp_path) == [0, 2, 3]
