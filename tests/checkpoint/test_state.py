"""Training-state capture and restore (SPEC §2): unwrapped keys, strict matching, RNG round trip."""
from __future__ import annotations

import os
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import load_checkpoint
from supervisor.errors import CheckpointError
from supervisor.state.rng import capture_rng_state, restore_rng_state
from supervisor.state import strip_wrapper_prefixes, unwrap_module

from .conftest import restore_into, small_state, train_step


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))


def _wrap(kind: str, module: torch.nn.Module) -> torch.nn.Module:
    if kind == "plain":
        return module
    if kind == "dataparallel":  # the DDP-style "module." wrapper; runs on CPU
        return torch.nn.DataParallel(module)
    if kind == "compiled":
        return torch.compile(module)  # wraps at once, compiles lazily: no compiler needed here
    raise AssertionError(kind)


KINDS = ["plain", "dataparallel", "compiled"]


@pytest.mark.parametrize("saver", KINDS)
@pytest.mark.parametrize("loader", KINDS)
def test_checkpoints_move_between_wrapped_and_plain_modules(manager_factory, tmp_path, clock, saver, loader):
    source = _wrap(saver, _net(1))
    path = manager_factory().save(1, TrainingState({"model": source}), wait=True)
    saved = load_checkpoint(path)["model"]
    assert list(saved) == list(_net(0).state_dict())  # unwrapped keys on disk
    assert saved._metadata["1"]["version"] == 2  # BatchNorm's version record survives

    target = _wrap(loader, _net(2))
    restore_into(tmp_path / "logdir", TrainingState({"model": target}))
    # (.cpu(): with CUDA present, DataParallel moves its module to cuda:0.)
    for key, value in unwrap_module(source).state_dict().items():
        assert torch.equal(unwrap_module(target).state_dict()[key].cpu(), value.cpu())


def test_unwrap_module_handles_nesting_and_leaves_others_alone():
    inner = _net(0)
    assert unwrap_module(torch.nn.DataParallel(torch.compile(inner))) is inner
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.1)
    assert unwrap_module(optimizer) is optimizer


def test_prefixed_state_dicts_saved_by_hand_still_load():
    plain = _net(0)
    prefixed = OrderedDict(("_orig_mod.module." + k, v) for k, v in _net(5).state_dict().items())
    TrainingState({"model": plain}).load_state_dict({"model": prefixed})
    assert torch.equal(plain[0].weight, _net(5)[0].weight)


def test_a_submodule_really_named_module_keeps_its_prefix():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

    holder = Holder()
    sd = holder.state_dict()
    assert strip_wrapper_prefixes(sd, holder.state_dict().keys()) is sd


def test_strict_load_names_missing_and_unexpected_entries():
    state = small_state()
    with pytest.raises(CheckpointError) as info:
        state.load_state_dict({"model": state["model"].state_dict(), "scheduler": {}, "global_step": 3})
    message = str(info.value)
    assert "missing entries ['optimizer']" in message and "unexpected entries ['scheduler']" in message
    state.load_state_dict({"model": state["model"].state_dict()}, strict=False)


def test_strict_load_names_the_entry_whose_keys_do_not_fit(manager_factory, tmp_path, clock):
    manager_factory().save(1, TrainingState({"model": torch.nn.Linear(3, 4)}), wait=True)
    with pytest.raises(CheckpointError) as info:
        restore_into(tmp_path / "logdir", TrainingState({"model": torch.nn.Linear(3, 5)}))
    assert "'model'" in str(info.value) and "model.ckpt-1" in str(info.value) and "step 1" in str(info.value)


def _draw() -> tuple:
    return (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), np.random.normal(),
            torch.rand(3).tolist(), torch.randn(2).tolist())


def test_rng_round_trip_continues_the_same_streams():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draw()
    state = capture_rng_state()
    expected = [_draw() for _ in range(3)]
    random.seed(100)
    np.random.seed(100)
    torch.manual_seed(100)
    restore_rng_state(state)
    assert [_draw() for _ in range(3)] == expected


def test_resumed_run_draws_what_an_uninterrupted_run_draws(manager_factory, tmp_path, clock):
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    manager = manager_factory()
    state = small_state()
    _draw()
    manager.save(1, state, wait=True)
    uninterrupted = _draw()

    torch.manual_seed(42)
    random.seed(42)
    np.random.seed(42)
    restore_into(tmp_path / "logdir", small_state(seed=7))
    assert _draw() == uninterrupted


def test_save_rng_false_leaves_the_generators_alone(manager_factory, tmp_path, clock):
    manager = manager_factory(save_rng=False)
    path = manager.save(1, small_state(), wait=True)
    assert "rng" not in load_checkpoint(path)
    fresh = small_state(seed=3)  # builds (and seeds) before the draws below
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    restore_into(tmp_path / "logdir", fresh, save_rng=False)
    assert torch.equal(torch.rand(2), expected)


def test_malformed_rng_state_is_a_checkpoint_error():
    state = capture_rng_state()
    state["numpy"] = {"kind": "MT19937"}
    with pytest.raises(CheckpointError, match="RNG state"):
        restore_rng_state(state)


def test_stateful_dataloader_resumes_at_the_same_batch(manager_factory, tmp_path, clock):
    stateful = pytest.importorskip("torchdata.stateful_dataloader", exc_type=ImportError,
                                   reason="torchdata (the data extra) is not installed")

    def loader():
        return stateful.StatefulDataLoader(list(range(20)), batch_size=2, shuffle=True,
                                           generator=torch.Generator().manual_seed(0))

    data = loader()
    it = iter(data)
    for _ in range(3):
        next(it)
    manager = manager_factory()
    manager.save(3, TrainingState({"data": data}), wait=True)
    expected = [next(it).tolist() for _ in range(4)]

    resumed = loader()
    restore_into(tmp_path / "logdir", TrainingState({"data": resumed}))
    it = iter(resumed)
    assert [next(it).tolist() for _ in range(4)] == expected


def test_optimizer_and_scheduler_round_trip(manager_factory, tmp_path, clock):
    state = small_state()
    scheduler = torch.optim.lr_scheduler.StepLR(state["optimizer"], step_size=2)
    full = TrainingState({**state, "scheduler": scheduler})
    for step in range(5):
        train_step(full, step)
        scheduler.step()
    manager_factory().save(5, full, wait=True)

    fresh = small_state(seed=9)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh["optimizer"], step_size=2)
    restore_into(tmp_path / "logdir", TrainingState({**fresh, "scheduler": fresh_scheduler}))
    assert fresh_scheduler.last_epoch == 5
    assert fresh["optimizer"].param_groups[0]["lr"] == state["optimizer"].param_groups[0]["lr"]
    assert torch.equal(fresh["optimizer"].state_dict()["state"][0]["exp_avg"],
                       state["optimizer"].state_dict()["state"][0]["exp_avg"])


def test_restore_leaves_no_mapping_of_the_checkpoint_file(manager_factory, tmp_path):
    """Restores map state.pt to avoid a copy; nothing may keep it mapped afterwards (an
    optimizer's moments would pin the file's disk space after retention deleted it)."""
    import gc

    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/self/maps")
    state = small_state()
    train_step(state, 0)
    path = manager_factory().save(1, state, wait=True)
    fresh = small_state(seed=4)
    restore_into(tmp_path / "logdir", fresh)
    gc.collect()
    with open("/proc/self/maps") as maps:
        assert os.path.join(path, "state.pt") not in maps.read()
    assert torch.equal(fresh["optimizer"].state_dict()["state"][0]["exp_avg"],
                       state["optimizer"].state_dict()["state"][0]["exp_avg"])
