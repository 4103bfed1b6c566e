"""Sharded tiers in one process (no process group: world size 1) — the fast checks of the
protocol: the part layout and its mark, the merged copy in the logdir, the restore choice
across tiers (local when newer, the logdir when the local tier is wiped), the retention and the
agreement's rounds."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from supervisor.checkpoint import verify_checkpoint
from supervisor.checkpoint.sharded import load_into
from supervisor.checkpoint.tiers.peers import make_sharded_manager
from supervisor.checkpoint.tiers.sharded import ShardedTieredCheckpointManager
from supervisor.checkpoint.tiers.sharded_agree import agree_step
from supervisor.state import TrainingState

pytestmark = pytest.mark.timeout(120)


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return TrainingState({"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=0.01)})


def _train(state: TrainingState, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    state["optimizer"].zero_grad()
    state["model"](torch.randn(3, 4, generator=g)).pow(2).mean().backward()
    state["optimizer"].step()


def _values(state: TrainingState) -> list:
    out = [t.clone() for t in state["model"].state_dict().values()]
    for s in state["optimizer"].state.values():
        out += [v.clone() for _, v in sorted(s.items())]
    return out


def _manager(tmp_path) -> ShardedTieredCheckpointManager:
    return make_sharded_manager(str(tmp_path / "logdir"), local_dir=str(tmp_path / "local"), persist_every_steps=3,
                                persist_every_secs=None, local_max_to_keep=2, save_mode="sync")


def test_one_process_saves_locally_persists_every_third_step_and_restores_the_newest_tier(tmp_path, caplog):
    state = _state(0)
    manager = _manager(tmp_path)
    manager.open()
    for step in range(5):
        _train(state, step)
        manager.save(step, state)
    manager._persister.flush(30)
    saved = _values(state)
    manager._final_abort.set()  # as a crash: no final copy
    manager.close(failed=True)
    root = tmp_path / "local" / "rank-0"
    assert sorted(os.listdir(root)) == ["model.ckpt-3", "model.ckpt-3.all-ranks", "model.ckpt-4",
                                        "model.ckpt-4.all-ranks"]
    logdir = tmp_path / "logdir"
    assert sorted(n for n in os.listdir(logdir) if n.startswith("model")) == ["model.ckpt-0", "model.ckpt-3"]
    assert sorted(verify_checkpoint(str(logdir / "model.ckpt-3")).files) == [
        ".metadata", "__0_0.distcp", "rank-0.metadata", "rng-0.pt"]

    restored = _state(1)
    manager = _manager(tmp_path)
    manager.open()
    with caplog.at_level("INFO"):
        assert manager.restore(restored).global_step == 4
    assert "restored step 4 from the local tier" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(_values(restored), saved))
    manager.close()  # persists step 4, the newest local one
    assert verify_checkpoint(str(logdir / "model.ckpt-4")).step == 4

    shutil.rmtree(tmp_path / "local")  # the node is replaced
    again = _state(2)
    manager = _manager(tmp_path)
    manager.open()
    assert manager.restore(again).global_step == 4
    assert all(torch.equal(a, b) for a, b in zip(_values(again), saved))
    manager.close()
    plain = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    assert load_into(str(logdir / "model.ckpt-4"), plain) == 4  # the merged copy reads in one process
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), saved))


def test_without_local_dir_the_front_door_gets_the_plain_sharded_manager(tmp_path):
    manager = make_sharded_manager(str(tmp_path / "logdir"), local_dir=None, persist_every_steps=None,
                                   persist_every_secs=None, local_max_to_keep=2, persist_grace_secs=120.0)
    assert type(manager).__name__ == "ShardedCheckpointManager"


def test_the_agreement_takes_the_newest_step_every_rank_holds_in_one_process():
    held = [9, 7, 4]
    propose = lambda c: next((s for s in held if c is None or s <= c), -1)  # noqa: E731
    assert agree_step(propose, newest=9, persistent=5, empty_rank=-1) == (9, 9, 5, -1, 2)
    assert agree_step(lambda c: -1, newest=-1, persistent=5, empty_rank=0) == (-1, -1, 5, 0, 1)


def test_a_chosen_step_restores_plain_and_tiered_sharded_checkpoints_in_one_process(tmp_path, caplog):
    from supervisor.checkpoint.sharded import ShardedCheckpointManager
    from supervisor.errors import CheckpointNotFoundError

    state, values = _state(0), {}
    plain = ShardedCheckpointManager(str(tmp_path / "plain"), save_mode="sync")
    tiered = _manager(tmp_path)  # local: the newest 2; the logdir: every third step
    try:
        for manager in (plain, tiered):
            manager.open()
        for step in range(5):
            _train(state, step)
            values[step] = _values(state)
            plain.save(step, state)
            tiered.save(step, state)
        tiered._persister.flush(30)
        with pytest.raises(CheckpointNotFoundError, match="no checkpoint of step 7 to restore in .*: the logdir "
                                                          "holds steps 0, 1, 2, 3, 4; choose one of those steps"):
            plain.restore(_state(9), step=7)
        with pytest.raises(CheckpointNotFoundError, match="the logdir holds steps 0, 3; the local tiers hold steps 3, 4 "):
            tiered.restore(_state(9), step=2)
        assert plain.restore(_state(9), step=str(tmp_path / "plain" / "model.ckpt-2")).global_step == 2  # a path
        for manager, step, tier in ((plain, 1, None), (tiered, 4, "local"), (tiered, 0, "persistent")):
            restored = _state(9)
            with caplog.at_level("INFO"):
                assert manager.restore(restored, step=step).global_step == step
            assert all(torch.equal(a, b) for a, b in zip(_values(restored), values[step]))
            assert tier is None or f"restored the chosen step {step} from the {tier} tier" in caplog.text
        assert "the local parts of the newer step(s) 3, 4 in" in caplog.text  # kept, no longer restored
        assert sorted(os.listdir(tmp_path / "local" / "rank-0")) == ["model.ckpt-3", "model.ckpt-4"]
    finally:
        for manager in (plain, tiered):
            manager.close()
