"""The step boundary (SPEC §3.5): one place where checkpoints and stops happen, for every front
door; commit notifications that keep saves asynchronous; the `Agreement` seam."""
from __future__ import annotations

import os
import threading

import pytest
import torch

import hooks
from supervisor import (
    CheckpointManager,
    CheckpointSessionCreator,
    Hook,
    MonitoredSession,
    MonitoredTrainingSession,
    Supervisor,
    TrainingState,
    load_checkpoint,
)
from supervisor.engine.boundary import Agreement, Decision, Requests


class Counter:
    """A stateful object a user hook changes in ``after_run`` (an LR schedule, an EMA...)."""

    def __init__(self) -> None:
        self.n = 0

    def state_dict(self):
        return {"n": torch.tensor(self.n)}

    def load_state_dict(self, sd):
        self.n = int(sd["n"])


class Bump(Hook):
    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def after_run(self, run_context, run_values):
        self.counter.n += 1


def saved_n(logdir, step):
    return int(load_checkpoint(os.path.join(logdir, f"model.ckpt-{step}"))["counter"]["n"])


def test_mts_checkpoint_holds_every_hooks_after_run(tmp_path):
    # The CheckpointSaverHook comes before the user's hooks (TF's order); its save at step 3
    # must still see Bump's after_run of step 3 (it held n=2 before the boundary existed).
    counter = Counter()
    with MonitoredTrainingSession(tmp_path, state={"counter": counter}, save_checkpoint_steps=3,
                                  save_checkpoint_secs=None, hooks=[Bump(counter)],
                                  handle_signals=False) as s:
        for _ in range(4):
            s.run(lambda: None)
    assert saved_n(tmp_path, 3) == 3
    assert saved_n(tmp_path, 4) == 4  # the final checkpoint, at the stopping boundary


def test_supervisor_and_mts_capture_the_same_cut(tmp_path):
    counter = Counter()
    with Supervisor(tmp_path / "sv", state={"counter": counter}, hooks=[Bump(counter)],
                    save_summaries_secs=0, handle_signals=False).managed_session() as s:
        for _ in range(3):
            s.run(lambda: None)
    assert saved_n(tmp_path / "sv", 3) == 3


def test_save_requested_by_a_hook_before_another_hook_sees_its_after_run(tmp_path):
    counter = Counter()

    class SaveAtTwo(Hook):
        def after_run(self, run_context, run_values):
            if run_context.session.global_step == 2:
                path = run_context.session.save_checkpoint()  # during the step: a request
                assert path.endswith("model.ckpt-2")

    manager = CheckpointManager(tmp_path)
    creator = CheckpointSessionCreator(TrainingState({"counter": counter}), manager)
    with MonitoredSession(creator, hooks=[SaveAtTwo(), Bump(counter)]) as s:
        for _ in range(3):
            s.run(lambda: None)
        s.save_checkpoint(wait=True)  # between steps: at once
    assert saved_n(tmp_path, 2) == 2
    assert saved_n(tmp_path, 3) == 3


class BlockingOpener:
    """Writes checkpoint files only once ``release`` is set: a save stays in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, path):
        self.entered.set()
        assert self.release.wait(30), "the test never released the writer"
        return open(path, "xb", buffering=0)


def test_listener_does_not_make_saves_synchronous(tmp_path):
    delivered = []

    class Listener(hooks.CheckpointSaverListener):
        def after_save(self, session, step):
            assert os.path.isdir(os.path.join(tmp_path, f"model.ckpt-{step}"))  # committed
            delivered.append((step, session.global_step, threading.current_thread()))

    opener = BlockingOpener()
    manager = CheckpointManager(tmp_path, opener=opener)
    creator = CheckpointSessionCreator(TrainingState({"model": torch.nn.Linear(2, 1)}), manager)
    hook = hooks.CheckpointSaverHook(tmp_path, save_steps=1000, listeners=[Listener()])
    main = threading.current_thread()
    with MonitoredSession(creator, hooks=[hook]) as s:
        assert opener.entered.wait(10)  # the creation save is being written...
        for _ in range(5):
            s.run(lambda: None)  # ...and training goes on meanwhile: the save is async
        assert delivered == []  # not committed yet: nothing delivered
        opener.release.set()
        manager.wait()
        s.run(lambda: None)  # the next boundary delivers the commit, on the training thread
        assert delivered == [(0, 6, main)]


def test_listener_stop_request_is_applied_at_the_delivering_boundary(tmp_path):
    class StopAfterFirstPeriodicSave(hooks.CheckpointSaverListener):
        def after_save(self, session, step):
            return step > 0

    with MonitoredTrainingSession(tmp_path, state={"c": Counter()}, save_checkpoint_steps=2,
                                  save_checkpoint_secs=None, handle_signals=False,
                                  chief_only_hooks=[hooks.CheckpointSaverHook(
                                      tmp_path, save_steps=2, listeners=[StopAfterFirstPeriodicSave()])]) as s:
        while not s.should_stop():
            s.run(lambda: None)
            s.checkpoint_manager.wait()  # make the commit arrive before the next boundary
    assert s.global_step == 3  # step 2's commit delivered at boundary 3, which stops
    assert "after_save returned True after the checkpoint of step 2" in s.stop_reason


class RecordingAgreement(Agreement):
    """An agreement that records what each boundary asked for and can force a decision; like
    a collective one, it is called at every boundary."""

    local = False

    def __init__(self, force_save_at=()):
        self.seen: list[tuple[int, Requests]] = []
        self.force_save_at = set(force_save_at)

    def decide(self, step, requests):
        self.seen.append((step, requests))
        decision = super().decide(step, requests)
        if step in self.force_save_at:  # as if another rank asked for a save
            return Decision(step, save=True, stop=decision.stop, save_reasons=("another rank",),
                            stop_reason=decision.stop_reason)
        return decision


def test_agreement_sees_requests_and_its_decision_is_applied(tmp_path):
    agreement = RecordingAgreement(force_save_at={2})
    manager = CheckpointManager(tmp_path)
    creator = CheckpointSessionCreator(TrainingState({"c": Counter()}), manager)
    with MonitoredSession(creator, hooks=[hooks.StopAtStepHook(last_step=4)], agreement=agreement) as s:
        while not s.should_stop():
            s.run(lambda: None)
    steps = [step for step, _ in agreement.seen]
    assert 2 in steps and steps[-1] == 4
    stop_requests = [r for step, r in agreement.seen if r.stop]
    assert stop_requests[0].stop_on_every_rank  # StopAtStepHook: every rank knows last_step
    assert os.path.isdir(tmp_path / "model.ckpt-2")  # saved because the agreement decided so
    assert not os.path.isdir(tmp_path / "model.ckpt-1")


def test_request_stop_between_steps_on_the_training_thread_is_immediate():
    with MonitoredSession() as s:
        s.run(lambda: None)
        s.request_stop(reason="enough")
        assert s.should_stop()
    assert s.stop_reason == "enough"


def test_stop_from_another_thread_between_steps_applies_at_the_next_boundary():
    with MonitoredSession() as s:
        s.run(lambda: None)
        t = threading.Thread(target=s.request_stop, name="stopper")
        t.start()
        t.join(5)
        assert s.stop_requested and not s.should_stop()
        s.run(lambda: None)
        assert s.should_stop() and s.global_step == 2


def test_coordinator_stop_names_the_requesting_thread():
    with MonitoredSession() as s:
        t = threading.Thread(target=s.coord.request_stop, name="my-service")
        t.start()
        t.join(5)
        s.run(lambda: None)
        assert s.should_stop()
    assert "my-service" in s.stop_reason


def test_save_checkpoint_with_wait_inside_a_step_is_refused(tmp_path):
    manager = CheckpointManager(tmp_path)
    creator = CheckpointSessionCreator(TrainingState({"c": Counter()}), manager)
    with MonitoredSession(creator) as s:
        with pytest.raises(RuntimeError, match="cannot wait during a step"):
            s.run(lambda: s.save_checkpoint(wait=True))


def test_save_checkpoint_after_close_names_the_fix(tmp_path):
    manager = CheckpointManager(tmp_path)
    creator = CheckpointSessionCreator(TrainingState({"c": Counter()}), manager)
    with MonitoredSession(creator) as s:
        s.run(lambda: None)
    with pytest.raises(RuntimeError, match="save inside the `with` block"):
        s.save_checkpoint()
