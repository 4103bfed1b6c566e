"""`CheckpointSaverHook` on an ``s3://`` checkpoint_dir (issue 24 item 1): its own manager saves
there with the hook's ``storage_options`` (never in a local directory named ``s3:``); given the
URL of the session's own manager, it saves through that one."""
from __future__ import annotations

import os

import pytest
import torch

import hooks
from supervisor import MonitoredSession, MonitoredTrainingSession, SessionCreator, TrainingState
from supervisor.checkpoint import latest_checkpoint, list_committed, load_checkpoint
from tests.s3_fixtures import options

pytestmark = pytest.mark.timeout(120)


def test_the_hooks_own_manager_saves_on_the_url(s3_server, s3_root, s3_storage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = s3_root + "/run"
    model = torch.nn.Linear(2, 1)
    hook = hooks.CheckpointSaverHook(url + "/", save_steps=2, storage_options=options(s3_server.endpoint))
    with MonitoredSession(SessionCreator(TrainingState({"model": model})), hooks=[hook],
                          handle_signals=False) as s:
        for _ in range(5):
            s.run(lambda: None)
    assert [step for step, _ in list_committed(url, "model.ckpt", s3_storage)] == [0, 2, 4, 5]
    assert latest_checkpoint(url, storage=s3_storage) == f"{url}/model.ckpt-5"
    saved = load_checkpoint(f"{url}/model.ckpt-5", storage_options=options(s3_server.endpoint))
    assert torch.equal(saved["model"]["weight"], model.weight.detach())
    assert os.listdir(tmp_path) == []  # nothing local


def test_a_hook_on_the_sessions_url_saves_through_the_sessions_manager(s3_server, s3_root, s3_storage):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    model = torch.nn.Linear(2, 1)
    extra = hooks.CheckpointSaverHook(url + "/", save_steps=3)  # a second manager would be refused (lease)
    with MonitoredTrainingSession(url, model, storage_options=opts, save_checkpoint_steps=100, hooks=[extra],
                                  handle_signals=False, log_step_count_steps=None, save_summaries_steps=None) as s:
        for _ in range(4):
            s.run(lambda: None)
    assert [step for step, _ in list_committed(url, "model.ckpt", s3_storage)] == [0, 3, 4]


def test_storage_options_with_a_local_checkpoint_dir_are_refused(tmp_path):
    with pytest.raises(ValueError, match="storage_options=.*local path"):
        hooks.CheckpointSaverHook(tmp_path, save_steps=1, storage_options={"endpoint_url": "http://x"})
