"""A save comes back as a value (issue 23): `start_save` returns `PendingSave(step, path,
committed)`, whose future resolves to the path once the checkpoint is committed — what the step
boundary listens to, instead of setting the manager's ``on_commit`` at every capture."""
from __future__ import annotations

import os

import torch

from supervisor import CheckpointManager, MonitoredSession, TrainingState
from supervisor.checkpoint import CheckpointSessionCreator


def test_start_save_returns_the_path_and_a_future_that_resolves_at_the_commit(tmp_path):
    state = TrainingState({"model": torch.nn.Linear(2, 2)})
    with CheckpointManager(str(tmp_path)) as manager:
        pending = manager.start_save(3, state)
        assert pending.step == 3 and pending.path == os.path.join(str(tmp_path), "model.ckpt-3")
        assert pending.committed.result(timeout=30) == pending.path
        assert manager.checkpoints[-1] == pending.path


def test_the_session_leaves_the_managers_on_commit_to_its_user(tmp_path):
    commits = []
    manager = CheckpointManager(str(tmp_path))
    manager.on_commit = lambda step, path: commits.append(step)
    creator = CheckpointSessionCreator(TrainingState({"model": torch.nn.Linear(2, 2)}), manager,
                                       logdir=str(tmp_path))
    with MonitoredSession(creator) as s:
        s.run(lambda: None)
        s.save_checkpoint(wait=True)
    assert commits == [1] and manager.on_commit is not None
