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
from supervisor.checkpoint.storage import Location, relocate, resolve_location, storage_for
from supervisor.estimator import (BestExporter, EvalSpec, FinalExporter, LatestExporter, RunConfig, SidecarEvaluator,
                                  TrainSpec, train_and_evaluate)
from supervisor.testing import FakeClock
from tests.estimator.estimator_toy import batches, endless, make_estimator
from tests.estimator.sidecar_helpers import ScriptedClock, StepTrainer, make_model, weight_metrics

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


def test_an_estimator_resolves_its_model_dir_once_for_a_whole_train_and_evaluate(logdir, calls):
    """The `RunConfig` resolves ``model_dir``; training, every evaluation, its events, the exports
    (Best, Latest, Final: listed, written, collected, read back) and the rerun reuse that location.
    Before: 10 calls locally, 40 on ``memory://`` (each export listing, write and collection, each
    index read and evaluation its own client); a warm-started RunConfig on the same store 4 (local)
    and 3 (memory) instead of its one (the source resolved, then read, each with its own storage)."""
    config = RunConfig(logdir, save_checkpoints_steps=5, log_step_count_steps=0, save_summary_steps=0)
    spec = EvalSpec(lambda: batches(), steps=2, throttle_secs=0,
                    exporters=[BestExporter("best"), LatestExporter("latest"), FinalExporter("final")])
    for _ in range(2):  # the second run finds the job done: reads what was evaluated and exported
        metrics, exports = train_and_evaluate(make_estimator(logdir, config=config, clock=FakeClock()),
                                              TrainSpec(endless(), max_steps=10), spec)
    assert metrics["global_step"] == 10 and exports == (None, None, None)
    assert len(calls) == 1, f"storage_for was called {len(calls)} times for one RunConfig"
    assert any(name.startswith("model.ckpt-10") for name in calls[0].listdir(logdir))
    # a warm start from that run, on the same store: through the new RunConfig's one client
    warm = RunConfig(logdir + "-warm", save_checkpoints_steps=5, log_step_count_steps=0, save_summary_steps=0)
    make_estimator(logdir + "-warm", config=warm, warm_start_from=logdir, clock=FakeClock()).train(endless(), max_steps=1)
    assert len(calls) == 2, f"storage_for was called {len(calls) - 1} times for a warm-started RunConfig"


def test_a_sidecar_evaluator_resolves_its_directories_once_not_per_evaluation(logdir, calls):
    """Its checkpoint directory, log directory, event files and every poll, read and mark check of
    the loop share one storage. Before: 1 call, then 21 in 3 rounds locally (every poll); 3 (each
    directory's client), then 1 on ``memory://``."""
    trainer = StepTrainer(resolve_location(logdir))  # its own manager on a location: no call either
    trainer.save(1)
    clock = ScriptedClock()
    clock.at(3, lambda: trainer.save(2))
    clock.at(6, lambda: trainer.save(3))
    before = len(calls)
    evaluator = SidecarEvaluator(make_model(), [torch.ones(3, 8)], logdir, eval_step=weight_metrics, timeout=10,
                                 poll_secs=1, clock=clock)
    made = len(calls) - before
    results = evaluator.start()
    trainer.close()
    assert [r.step for r in results] == [1, 2, 3]
    expected = 0 if "://" not in logdir else 1  # a local directory is served by the local storage: none to build
    assert (made, len(calls) - before - made) == (expected, 0), \
        f"storage_for: {made} call(s) at construction, {len(calls) - before - made} in 3 evaluation rounds"


def test_prune_reads_every_checkpoint_through_the_commands_one_storage(calls, capsys):
    """``supervisor prune memory://...``: the command builds the logdir's storage once and checks
    each checkpoint it keeps through it. Before: 1 + 1 per checkpoint checked (each one's reader
    resolved the URL again; 1 + 2 each before `CheckpointReader` resolved once): 3 here."""
    from supervisor.cli import main

    root = f"memory://t-{uuid.uuid4().hex[:20]}"
    trainer = StepTrainer(resolve_location(f"{root}/run"), max_to_keep=None)
    for step in (1, 2, 3, 4):
        trainer.save(step)
    trainer.close()
    before = len(calls)
    try:
        assert main(["prune", f"{root}/run", "--keep", "2"]) == 0
        assert "keeping 2" in capsys.readouterr().out
        assert len(calls) - before == 1, f"storage_for was called {len(calls) - before} times by one prune"
    finally:
        storage_for(root).remove_tree(root)


def test_relocate_serves_a_path_beside_a_location_through_its_storage(logdir, tmp_path, calls):
    location = resolve_location(logdir)
    before = len(calls)
    beside = relocate(location, logdir + "/export/best" + ("/" if location.is_object_store else ""))  # URL: no "/"
    assert beside == Location(location.join("export", "best"), location.storage) == location.child("export", "best")
    local = relocate(location, f"file://{tmp_path}/x")
    assert local.path == f"{tmp_path}/x" and not local.is_object_store
    assert relocate(location, beside) is beside
    other = "s3://bucket/run" if location.is_object_store else "memory://t/run"
    assert relocate(location, other) is None  # another scheme: resolve it with its own options
    assert len(calls) == before  # no client was built
