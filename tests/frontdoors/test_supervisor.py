"""Supervisor scenarios (SPEC §6, §9), ported from TF's supervisor_test.py behaviours."""
from __future__ import annotations

import glob
import os
import threading

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import supervisor
from hooks import StopAtStepHook
from supervisor import Supervisor
from supervisor.testing import FakeClock, RecordingHook


def make_model(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def step_fn(model, opt):
    x = torch.ones(4, 3)

    def train_step():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach(), "lr": opt.param_groups[0]["lr"]}

    return train_step


def steps_on_disk(logdir):
    return sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(os.path.join(logdir, "model.ckpt-*"))
                  if ".tmp-" not in p)


def events(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def session_logs(logdir):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            if event.HasField("session_log"):
                found.append((event.session_log.status, event.step))
    return found


def test_basics_final_checkpoint_and_events(tmp_path):
    model, opt = make_model()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, save_summaries_secs=0.01)
    with sv.managed_session() as s:
        for _ in range(5):
            s.run(step_fn(model, opt))
    assert steps_on_disk(tmp_path) == [0, 5]  # at creation, and the final one
    assert supervisor.latest_checkpoint(tmp_path).endswith("model.ckpt-5")
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1
    assert sv.global_step == 5


def test_restore_then_continue_with_same_weights(tmp_path):
    model, opt = make_model(0)
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session() as s:
        for _ in range(3):
            s.run(step_fn(model, opt))
    trained = model.weight.detach().clone()

    model2, opt2 = make_model(seed=1)  # different initial weights: the restore must overwrite them
    rec = RecordingHook()
    with Supervisor(tmp_path, model=model2, optimizer=opt2, hooks=[rec]).managed_session() as s:
        assert s.global_step == 3
        assert torch.equal(model2.weight, trained)
        s.run(step_fn(model2, opt2))
    assert rec.events[1] == ("after_create_session", 3)
    assert steps_on_disk(tmp_path) == [0, 3, 4]  # restored step 3 not rewritten


def test_num_steps_counted_from_the_restored_step(tmp_path):
    model, opt = make_model()
    with Supervisor(tmp_path, model=model, optimizer=opt, hooks=[StopAtStepHook(last_step=3)]).managed_session() as s:
        while not s.should_stop():
            s.run(step_fn(model, opt))
    with Supervisor(tmp_path, model=model, optimizer=opt, hooks=[StopAtStepHook(num_steps=4)]).managed_session() as s:
        while not s.should_stop():
            s.run(step_fn(model, opt))
    assert s.global_step == 7


def test_user_error_is_reraised_after_services_stop_and_no_final_checkpoint(tmp_path):
    model, opt = make_model()
    rec = RecordingHook()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, hooks=[rec], save_summaries_secs=0.01)
    with pytest.raises(ValueError, match="user error"):
        with sv.managed_session() as s:
            s.run(step_fn(model, opt))
            raise ValueError("user error")
    assert not [t for t in threading.enumerate() if t.name.startswith("supervisor-")]
    assert steps_on_disk(tmp_path) == [0]  # no final checkpoint after an error
    assert rec.calls[-1] == "on_exception"


def test_stop_iteration_is_swallowed_and_final_checkpoint_written(tmp_path):
    model, opt = make_model()
    batches = iter(range(4))
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session() as s:
        while True:
            next(batches)
            s.run(step_fn(model, opt))
    assert steps_on_disk(tmp_path) == [0, 4]
    assert "StopIteration" in s.stop_reason


def test_checkpoint_service_saves_at_the_next_boundary(tmp_path):
    clock = FakeClock()
    model, opt = make_model()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=60, save_summaries_secs=0, clock=clock)
    with sv.managed_session() as s:
        train = step_fn(model, opt)
        clock.wait_for_waiters(1)
        s.run(train)
        s.run(train)
        s.checkpoint_manager.wait()
        assert steps_on_disk(tmp_path) == [0]  # not due yet
        clock.advance(60)
        clock.wait_for_waiters(1)  # the service ticked: a capture is requested
        s.run(train)  # ...and happens at this boundary
        s.checkpoint_manager.wait()
        assert steps_on_disk(tmp_path) == [0, 3]
        clock.advance(60)
        clock.wait_for_waiters(1)
        s.run(train)
        s.checkpoint_manager.wait()
        assert steps_on_disk(tmp_path) == [0, 3, 4]
    assert steps_on_disk(tmp_path) == [0, 3, 4]  # step unchanged since: no extra final save


def test_summary_and_step_rate_services(tmp_path):
    clock = FakeClock()
    model, opt = make_model()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0, save_summaries_secs=10,
                    summary_fn=lambda session: {"custom/step_squared": session.global_step ** 2}, clock=clock)
    with sv.managed_session() as s:
        train = step_fn(model, opt)
        clock.wait_for_waiters(2)  # first ticks done: the rate measurement starts, no point yet
        for _ in range(20):
            s.run(train)
        clock.advance(10)
        clock.wait_for_waiters(2)
        clock.advance(10)  # a stalled loop: no steps in this interval
        clock.wait_for_waiters(2)
        sv.summary_computed({"user/value": 1.5})
    acc = events(tmp_path)
    rate = [(e.step, e.value) for e in acc.Scalars("global_step/sec")]
    # No 0.0 at the start (a rate needs two points); the stall is drawn once, at the stalled step
    # (SPEC §9, issue 22.2: never a second point at step 20).
    assert rate == [(20, 2.0), (21, 0.0)]
    assert [(e.step, round(e.value, 6)) for e in acc.Scalars("lr")] == [(20, 0.1)]
    assert [e.step for e in acc.Scalars("loss")] == [20]  # not rewritten while stalled
    # summary_fn is called on the first tick too (step 0), then at the next new step only
    assert [(e.step, e.value) for e in acc.Scalars("custom/step_squared")] == [(0, 0.0), (20, 400.0)]
    assert [(e.step, e.value) for e in acc.Scalars("user/value")] == [(20, 1.5)]


def test_start_session_log_at_each_sessions_first_step_and_checkpoint_logs(tmp_path):
    model, opt = make_model()
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session() as s:
        for _ in range(3):
            s.run(step_fn(model, opt))
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session() as s:
        s.run(step_fn(model, opt))
    from tensorboard.compat.proto.event_pb2 import SessionLog

    logs = session_logs(tmp_path)
    # At each session's first step: TensorBoard hides events at and after a START's step, and
    # the point at step 3 describes the checkpoint the second session resumed from.
    assert [step for status, step in logs if status == SessionLog.START] == [1, 4]
    assert [step for status, step in logs if status == SessionLog.CHECKPOINT] == [0, 3, 4]
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 2  # one per session start


def test_service_exception_stops_and_is_reraised(tmp_path):
    clock = FakeClock()
    model, opt = make_model()

    def bad_summary(session):
        raise OSError("summary backend down")

    sv = Supervisor(tmp_path, model=model, optimizer=opt, summary_fn=bad_summary, save_summaries_secs=5,
                    clock=clock)
    with pytest.raises(OSError, match="summary backend down"):
        with sv.managed_session() as s:
            s.run(step_fn(model, opt))
            clock.advance(5)
            assert s.coord.wait_for_stop(5)
            while not s.should_stop():
                s.run(step_fn(model, opt))
    assert steps_on_disk(tmp_path) == [0]


def test_user_loop_thread_is_joined_at_close(tmp_path):
    ticks = []
    sv = Supervisor(None, model=torch.nn.Linear(1, 1))
    with sv.managed_session() as s:
        thread = sv.loop(3600, lambda: ticks.append(1))
        s.run(lambda: None)
    assert ticks == [1] and not thread.is_alive()


def test_logdir_none_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sv = Supervisor(None, model=torch.nn.Linear(1, 1))
    with sv.managed_session() as s:
        s.run(lambda: {"loss": 1.0})
        assert s.summary_writer is None and s.checkpoint_manager is None
        with pytest.raises(RuntimeError, match="writing a summary requires a summary writer"):
            sv.summary_computed({"x": 1.0})
        with pytest.raises(RuntimeError, match="has no checkpoint directory"):
            s.save_checkpoint()
    assert os.listdir(tmp_path) == []
    assert sv.save_path is None


def test_non_chief_restores_the_chiefs_checkpoint_and_never_writes(tmp_path):
    model, opt = make_model()
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session() as s:
        s.run(step_fn(model, opt))
    before = sorted(os.listdir(tmp_path))
    worker_model, worker_opt = make_model(seed=3)
    sv = Supervisor(tmp_path, model=worker_model, optimizer=worker_opt, is_chief=False)
    with sv.managed_session() as s:
        assert s.global_step == 1 and not s.is_chief
        assert torch.equal(worker_model.weight, model.weight)
        s.run(step_fn(worker_model, worker_opt))
        assert s.summary_writer is None
        with pytest.raises(RuntimeError, match="is not the chief"):
            s.save_checkpoint()
    assert sorted(os.listdir(tmp_path)) == before


def test_second_writer_on_the_same_logdir_fails_fast(tmp_path):
    model, opt = make_model()
    with Supervisor(tmp_path, model=model, optimizer=opt).managed_session():
        with pytest.raises(supervisor.LogdirInUseError, match=f"pid {os.getpid()}"):
            with Supervisor(tmp_path, model=model, optimizer=opt).managed_session():
                pass


def test_save_checkpoint_at_epoch_end(tmp_path):
    model, opt = make_model()
    with Supervisor(tmp_path, model=model, optimizer=opt, save_model_secs=0).managed_session() as s:
        s.run(step_fn(model, opt))
        s.run(step_fn(model, opt))
        path = s.save_checkpoint(wait=True)
        assert path == os.path.join(str(tmp_path), "model.ckpt-2") and os.path.isdir(path)
    assert steps_on_disk(tmp_path) == [2]  # save_model_secs=0: no service saves, final unchanged


def test_supervisor_properties(tmp_path):
    model, opt = make_model()
    sv = Supervisor(tmp_path, model=model, optimizer=opt, checkpoint_basename="net")
    assert sv.save_path == os.path.join(str(tmp_path), "net") and sv.is_chief and sv.summary_writer is None
    with sv.managed_session() as s:
        assert sv.summary_writer is s.summary_writer is not None
        assert sv.coord is s.coord
        s.run(step_fn(model, opt))
        sv.request_stop()
        assert sv.should_stop() and s.should_stop()
    assert steps_on_disk(tmp_path) == [] and sorted(os.listdir(tmp_path))[-1].startswith("net-")


def test_managed_session_without_with_names_the_fix(tmp_path):
    sv = Supervisor(None, model=torch.nn.Linear(2, 1), handle_signals=False)
    with pytest.raises(AttributeError, match=r"with sv.managed_session\(\) as s: s.run"):
        sv.managed_session().run(lambda: None)
