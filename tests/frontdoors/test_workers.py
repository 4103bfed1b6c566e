"""Non-chief sessions (SPEC §4, §7, §8): they know the chief's logdir read-only and
`GlobalStepWaiterHook` waits on the chief's committed progress there."""
from __future__ import annotations

import logging
import os
import threading

import torch

import hooks
from supervisor import MonitoredTrainingSession, latest_checkpoint
from tests.log_handshake import LineSeen


def make_state(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


HOLD_AT = 5  # the chief holds here, below the worker's step 10, until the worker is waiting


def run_chief(logdir, last_step, started, go):
    model, opt = make_state()
    with MonitoredTrainingSession(logdir, model, opt, save_checkpoint_steps=1, save_checkpoint_secs=None,
                                  hooks=[hooks.StopAtStepHook(last_step=last_step)],
                                  handle_signals=False, log_step_count_steps=None,
                                  save_summaries_steps=None) as s:
        s.checkpoint_manager.wait()
        started.set()
        while not s.should_stop():
            if s.global_step == HOLD_AT:
                assert go.wait(60), "the worker never started waiting"
            s.run(lambda: None)



def test_worker_waits_for_the_chiefs_committed_step(tmp_path):
    started, go = threading.Event(), threading.Event()
    chief = threading.Thread(target=run_chief, args=(tmp_path, 30, started, go), name="chief")
    waiting, waiter_logger = LineSeen("waiting for global step 10", go), logging.getLogger("hooks.basic")
    level = waiter_logger.level
    waiter_logger.addHandler(waiting)
    waiter_logger.setLevel(logging.INFO)
    chief.start()
    try:
        assert started.wait(30)
        before = set(os.listdir(tmp_path))
        model, opt = make_state(seed=1)
        waiter = hooks.GlobalStepWaiterHook(10, poll_secs=0.01)
        with MonitoredTrainingSession(tmp_path, model, opt, is_chief=False, hooks=[waiter],
                                      max_wait_secs=30, handle_signals=False) as s:
            assert s.logdir == os.fspath(tmp_path) and not s.is_chief
            s.run(lambda: None)  # returns once the chief has committed step >= 10
            committed = latest_checkpoint(tmp_path)
            assert go.is_set() and committed is not None and int(committed.rsplit("-", 1)[1]) >= 10
            assert s.summary_writer is None and s.checkpoint_manager is None
    finally:
        go.set()
        chief.join(60)
        waiter_logger.removeHandler(waiting)
        waiter_logger.setLevel(level)
    assert not chief.is_alive()
    # the worker wrote nothing: every file is the chief's (checkpoints, index, lock, events)
    created = set(os.listdir(tmp_path)) - before
    # (.supervisor.finished: the chief marks its clean end, issue 12)
    chiefs = ("checkpoint", ".supervisor.finished")
    assert all(name.startswith("model.ckpt-") or name in chiefs for name in created), created
