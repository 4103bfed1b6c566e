"""The ``memory://`` backend (one module and its registration) carries the whole runtime in one
process: MonitoredTrainingSession saves and resumes through it, the checkpoint index, retention,
the lease, the verified reader and the CheckpointReader all work on it."""
from __future__ import annotations

import uuid

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import (CheckpointReader, MonitoredTrainingSession, get_checkpoint_state, latest_checkpoint,
                        load_checkpoint, verify_checkpoint)
from supervisor.checkpoint.storage import storage_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def logdir():
    root = f"memory://t-{uuid.uuid4().hex[:20]}"
    yield f"{root}/run"
    storage_for(root).remove_tree(root)


def _train(logdir: str, model: torch.nn.Module, last_step: int, **kwargs) -> int:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        loss = model(torch.ones(2, 3)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return {"loss": loss}

    with MonitoredTrainingSession(logdir, model, opt, hooks=[StopAtStepHook(last_step=last_step)],
                                  save_checkpoint_steps=2, save_checkpoint_secs=None, max_to_keep=2,
                                  **kwargs) as session:
        first = session.global_step
        while not session.should_stop():
            session.run(step)
    return first


def test_a_session_saves_resumes_and_keeps_max_to_keep_on_memory(logdir):
    model = torch.nn.Linear(3, 1)
    assert _train(logdir, model, 6) == 0
    storage = storage_for(logdir)
    assert storage.is_object_store and storage.scheme == "memory"
    assert latest_checkpoint(logdir) == f"{logdir}/model.ckpt-6"
    state = get_checkpoint_state(logdir)
    assert [p.rsplit("-", 1)[1] for p in state.all_model_checkpoint_paths] == ["4", "6"]  # retention: 2 kept
    names = storage.listdir(logdir)
    assert [n for n in names if n.startswith("model.ckpt-")] == ["model.ckpt-4", "model.ckpt-6"]
    assert ".supervisor.lease" in names  # the lock on an object store: a lease
    verify_checkpoint(f"{logdir}/model.ckpt-6")
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    fresh = torch.nn.Linear(3, 1)
    assert _train(logdir, fresh, 8) == 6  # resumed from step 6 with its weights
    assert latest_checkpoint(logdir) == f"{logdir}/model.ckpt-8"
    loaded = load_checkpoint(f"{logdir}/model.ckpt-6")
    torch.testing.assert_close(loaded["model"]["weight"], weights["weight"])
    reader = CheckpointReader(f"{logdir}/model.ckpt-8")
    assert "model/weight" in reader.get_variable_to_shape_map()
