"""A front door resolves its directory ONCE into a `Location` (path + storage) and passes it
inward (issue 32): during a whole session — construction, restore-or-init, saves, summaries,
close — `storage_for` is called once, and the checkpoint manager and the summary writer use that
one storage. Before: 4 calls on a local logdir (the index read twice, the writer's storage, the
events location), 6 on ``memory://`` (the options checked four times, each building a client)."""
from __future__ import annotations

import sys
import uuid

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession, SingularMonitoredSession, Supervisor
from supervisor.checkpoint import storage as storage_package
from supervisor.checkpoint.storage import Location, resolve_location, storage_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def calls(monkeypatch):
    """Every `storage_for` call, wherever the name was imported (the storages they returned)."""
    made: list = []
    real = storage_package.storage_for

    def counting(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(("supervisor", "hooks")) \
                and getattr(module, "storage_for", None) is real:
            monkeypatch.setattr(module, "storage_for", counting)
    return made


@pytest.fixture(params=["local", "memory"])
def logdir(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "run")
        return
    root = f"memory://t-{uuid.uuid4().hex[:20]}"
    yield f"{root}/run"
    storage_for(root).remove_tree(root)


def _model():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train(session, last_step: int) -> None:
    while not session.should_stop() and session.global_step < last_step:
        session.run(lambda: None)


@pytest.mark.parametrize("door", ["MonitoredTrainingSession", "SingularMonitoredSession"])
def test_a_step_hook_session_resolves_its_logdir_once(logdir, calls, door):
    session_class = {"MonitoredTrainingSession": MonitoredTrainingSession,
                     "SingularMonitoredSession": SingularMonitoredSession}[door]
    with session_class(logdir, *_model(), save_checkpoint_steps=2, save_summaries_steps=1,
                       hooks=[StopAtStepHook(last_step=4)], handle_signals=False) as session:
        _train(session, 4)
        manager = session.checkpoint_manager
    assert len(calls) == 1, f"storage_for was called {len(calls)} times in one session"
    assert manager.storage is calls[0]  # the checkpoints and the events (no call of their own): one client
    assert "model.ckpt-4" in calls[0].listdir(logdir)  # saved through it


def test_a_supervisor_resolves_its_logdir_once_for_every_session(logdir, calls):
    sv = Supervisor(logdir, *_model(), save_model_secs=0, save_summaries_secs=0, handle_signals=False)
    for last_step in (2, 4):  # a second managed session: the same location, no new client
        with sv.managed_session() as session:
            _train(session, last_step)
    assert len(calls) == 1, f"storage_for was called {len(calls)} times in two sessions"
    assert sv.global_step == 4


def test_a_location_carries_its_storage_and_refuses_options_again(logdir):
    location = resolve_location(logdir)
    assert isinstance(location, Location) and resolve_location(location) is location
    assert storage_for(location) is location.storage
    with pytest.raises(ValueError, match=r"storage_options=\{'anon': True\}.*resolved location.*drop them"):
        resolve_location(location, {"anon": True})
