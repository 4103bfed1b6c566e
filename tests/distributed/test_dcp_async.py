"""checkpoint_format="dcp" saves are asynchronous: the caller is blocked only for the staging copy,
the commit protocol stays whole (one process here; 2 and 3 ranks in test_dcp_async_ranks.py), and a
one-process restore of a sharded checkpoint brings back rank 0's RNG and loader generators."""
from __future__ import annotations

import os
import threading
import time
import warnings

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import latest_checkpoint, verify_checkpoint
from supervisor.checkpoint.sharded import ShardedCheckpointManager, load_into, save_sharded, commit as dcp_commit
from supervisor.errors import CheckpointError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(seed: int = 0) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 8)).pow(2).mean().backward()
    optimizer.step()
    return TrainingState.from_arguments(model=model, optimizer=optimizer)


def _params(state: TrainingState) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state["model"].state_dict().items()}


@pytest.fixture
def gate(monkeypatch):
    """Holds every rank's write (``dcp_commit.write_own_part``) until ``gate.set()``."""
    event = threading.Event()
    real = dcp_commit.write_own_part

    def held(path, save):
        assert event.wait(30), "the test never opened the gate"
        return real(path, save)

    monkeypatch.setattr(dcp_commit, "write_own_part", held)
    yield event
    event.set()


def test_an_async_save_returns_before_its_files_exist_and_commits_the_values_it_captured(tmp_path, gate):
    state = _state()
    commits = []
    with_manager = ShardedCheckpointManager(tmp_path)
    with_manager.open()
    with_manager.on_commit = lambda step, path: commits.append((step, path, threading.current_thread().name))
    saved = _params(state)
    path = with_manager.save(7, state)
    assert path == str(tmp_path / "model.ckpt-7") and not os.path.exists(path)  # not written yet
    assert with_manager.last_saved_step == 7 and latest_checkpoint(str(tmp_path)) is None
    with torch.no_grad():  # the next step changes the parameters in place: the checkpoint must not see it
        for p in state["model"].parameters():
            p.add_(100.0)
    gate.set()
    with_manager.wait()
    assert commits == [(7, path, "supervisor-dcp-writer")]
    verify_checkpoint(path)
    assert latest_checkpoint(str(tmp_path)) == path
    fresh = _state(seed=5)
    assert load_into(path, fresh) == 7
    for name, value in _params(fresh).items():
        assert torch.equal(value, saved[name]), name
    with_manager.close()


def test_a_save_while_one_is_in_flight_waits_for_it_and_wait_true_returns_committed(tmp_path, gate):
    state = _state()
    manager = ShardedCheckpointManager(tmp_path, max_to_keep=1)
    manager.open()
    commits = []
    manager.on_commit = lambda step, path: commits.append(step)
    manager.save(1, state)
    paths = []
    second = threading.Thread(target=lambda: paths.append(manager.save(2, state, wait=True)), name="second")
    second.start()
    second.join(0.3)
    assert second.is_alive() and commits == []  # save 2 waits for save 1, held at the gate
    gate.set()  # the test's release, not a timer's
    second.join(60)
    path = paths[0]
    assert commits == [1, 2]  # then it committed, after save 1
    verify_checkpoint(path)
    fresh = _state(seed=5)
    load_into(path, fresh)  # a waited-for save writes the live state (no staging copy): the same values
    assert all(torch.equal(v, _params(state)[k]) for k, v in _params(fresh).items())
    manager.close()
    # retention (max_to_keep=1) deleted step 1 for good (after the commit): no .deleting-* left
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("model.ckpt")) == ["model.ckpt-2"]


def test_a_failed_background_save_publishes_nothing_and_is_reported(tmp_path, monkeypatch):
    state = _state()
    manager = ShardedCheckpointManager(tmp_path)
    manager.open()
    manager.save(1, state, wait=True)
    real = dcp_commit.write_own_part

    def failing(path, save):
        outcome = real(path, save)
        return {"ok": False, "message": "rank 0: OSError: disk full (injected)", "records": {}} \
            if save.step == 2 else outcome  # the chief discards its temp directory

    monkeypatch.setattr(dcp_commit, "write_own_part", failing)
    errors = []
    manager.on_error = errors.append
    manager.save(2, state)
    manager.wait()  # delivered to on_error: not raised again
    assert len(errors) == 1 and "disk full (injected)" in str(errors[0]) and "step 2" in str(errors[0])
    assert manager.last_saved_step == 1
    assert latest_checkpoint(str(tmp_path)).endswith("model.ckpt-1")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n or n == "model.ckpt-2"]
    with pytest.raises(CheckpointError, match="step 2"):
        manager.close()  # a clean close: nothing acted on it (as CheckpointManager)
    again = ShardedCheckpointManager(tmp_path)  # without on_error: raised by the next call
    again.open()
    again.save(2, state)
    with pytest.raises(CheckpointError, match="step 2.*disk full"):
        again.wait()
    again.close()


def test_sync_mode_writes_on_the_calling_thread(tmp_path):
    state = _state()
    manager = ShardedCheckpointManager(tmp_path, save_mode="sync")
    with pytest.raises(RuntimeError, match="not open; call open"):
        manager.save(1, state)
    manager.open()
    with pytest.raises(ValueError, match="step"):
        manager.save(-1, state)
    with pytest.raises(TypeError, match="TrainingState"):
        manager.save(1, {"model": state["model"]})
    threads = []
    manager.on_commit = lambda step, path: threads.append(threading.current_thread())
    verify_checkpoint(manager.save(4, state))
    assert threads == [threading.current_thread()]
    manager.close()
    with pytest.raises(ValueError, match="save_mode"):
        ShardedCheckpointManager(tmp_path, save_mode="later")


# ---------------------------------------------------------------- loader generators (SPEC §2)
def _loader(seed: int):
    stateful_dataloader = pytest.importorskip(
        "torchdata.stateful_dataloader", exc_type=ImportError, reason="torchdata (the 'data'/'test' extra) is not installed")

    return stateful_dataloader.StatefulDataLoader(list(range(12)), batch_size=2, shuffle=True,
                              generator=torch.Generator().manual_seed(seed))


def _batches(iterable) -> list[list[int]]:
    return [b.tolist() for b in iterable]


@pytest.mark.parametrize("how", ["load_into", "manager_restore"])
def test_a_one_process_restore_brings_back_rank_0s_rng_and_loader_generator(tmp_path, how):
    torch.manual_seed(0)
    loader = _loader(seed=1)
    state = TrainingState({"model": torch.nn.Linear(3, 2), "data": loader})
    first = _batches(loader)  # epoch 1 draws from the loader's generator
    batches = iter(loader)
    _batches([next(batches), next(batches)])  # mid-epoch 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = save_sharded(str(tmp_path), "model.ckpt", 8, state, wall_time=0.0)
    expected_draw = torch.rand(3)
    expected = _batches(batches) + _batches(loader)  # the rest of epoch 2, then epoch 3
    assert expected[4:] != first  # the generator moved on: epoch 3 is another order

    torch.manual_seed(99)
    fresh = TrainingState({"model": torch.nn.Linear(3, 2), "data": _loader(seed=7)})
    if how == "load_into":
        assert load_into(path, fresh) == 8
    else:
        manager = ShardedCheckpointManager(tmp_path)
        manager.open()
        assert manager.restore(fresh).global_step == 8
        manager.close()
    assert torch.equal(torch.rand(3), expected_draw)
    assert _batches(fresh["data"]) + _batches(fresh["data"]) == expected


def test_load_into_a_plain_module_leaves_the_rng_alone(tmp_path):
    state = TrainingState({"model": torch.nn.Linear(3, 2)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = save_sharded(str(tmp_path), "model.ckpt", 1, state, wall_time=0.0)
    target = torch.nn.Linear(3, 2)
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    load_into(path, target)
    assert torch.equal(target.weight, state["model"].weight)
    assert torch.equal(torch.rand(2), expected)


# ---------------------------------------------------------------- in a session
def test_listeners_hear_of_async_sharded_commits_and_the_final_save_is_committed_at_close(tmp_path):
    import hooks
    from supervisor import MonitoredTrainingSession

    heard = []

    class Listener(hooks.CheckpointSaverListener):
        def after_save(self, session, step):  # on the training thread, after the commit
            heard.append((step, threading.current_thread() is threading.main_thread(),
                          os.path.exists(os.path.join(tmp_path, f"model.ckpt-{step}", "MANIFEST.json"))))

    state = _state()
    saver = hooks.CheckpointSaverHook(str(tmp_path), save_steps=2, listeners=[Listener()])
    with MonitoredTrainingSession(str(tmp_path), model=state["model"], optimizer=state["optimizer"],
                                  checkpoint_format="dcp", hooks=[saver, hooks.StopAtStepHook(last_step=5)],
                                  save_checkpoint_steps=None, save_checkpoint_secs=None,
                                  log_step_count_steps=None, save_summaries_steps=None) as s:
        while not s.should_stop():
            s.run(lambda: None)
    assert [h[0] for h in heard] == [0, 2, 4, 5] and all(h[1] and h[2] for h in heard), heard
    assert latest_checkpoint(str(tmp_path)).endswith("model.ckpt-5")  # the final save, committed
    verify_checkpoint(os.path.join(tmp_path, "model.ckpt-5"))


def test_a_failed_async_sharded_save_stops_the_session_with_the_error(tmp_path, monkeypatch):
    from supervisor import MonitoredTrainingSession

    real = dcp_commit.write_own_part
    monkeypatch.setattr(dcp_commit, "write_own_part", lambda path, save: real(path, save) if save.step < 3 else
                        {"ok": False, "message": "rank 0: OSError: disk full (injected)", "records": {}})
    state = _state()
    steps = []

    def step():  # past step 3 (its save under way), the handshake: that save has failed
        if s.global_step >= 3:
            s.checkpoint_manager.wait()

    with pytest.raises(CheckpointError, match="step 3.*disk full") as raised:
        with MonitoredTrainingSession(str(tmp_path), model=state["model"], checkpoint_format="dcp",
                                      save_checkpoint_steps=3, log_step_count_steps=None,
                                      save_summaries_steps=None) as s:
            while not s.should_stop() and s.global_step < 50:
                s.run(step)
                steps.append(s.global_step)
    # Stopped by the failure, not by the loop's bound: step 4's run waited for step 3's save, so its
    # failure is known by the end of that run and raised by step 4's run (at its end boundary, or at
    # its start when the failure arrived first: both are "the next boundary"), or by step 5's at the latest.
    assert steps[-1] in (3, 4), steps
    # ... by the session at a boundary (the failure went to on_error), never out of the step's own wait()
    assert "step" not in [entry.name for entry in raised.traceback], raised.traceback
    assert latest_checkpoint(str(tmp_path)).endswith("model.ckpt-0")


def test_a_failed_close_abandons_a_stuck_save_in_bounded_time_and_publishes_nothing(tmp_path, gate, monkeypatch,
                                                                                    caplog):
    from supervisor.checkpoint.sharded import manager as dcp_manager

    monkeypatch.setattr(dcp_manager, "FAILED_CLOSE_JOIN_SECS", 0.3)
    manager = ShardedCheckpointManager(tmp_path)
    manager.open()
    manager.save(1, _state())  # held in its write (the gate) like a save waiting for a hung peer
    start = time.monotonic()
    manager.close(failed=True)
    assert time.monotonic() - start < 5
    assert "did not end within 0.3 s" in caplog.text
    gate.set()  # the abandoned save wakes up after the close: it must not publish
    manager._writer.join(30)
    assert latest_checkpoint(str(tmp_path)) is None
    assert not [n for n in os.listdir(tmp_path) if n.startswith("model.ckpt")]
