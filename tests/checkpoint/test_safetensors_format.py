"""The contributor exercise of a new checkpoint format (supervisor/checkpoint/load/safetensors_format.py
and its line in the registry's BUILTIN_FORMATS): saved by `CheckpointManager(checkpoint_format=)`,
restored by its `restore`, read by `load_checkpoint` and `CheckpointReader`, listed, verified and
inspected by the CLI (a real subprocess), a damaged file refused — and no pickle in the file."""
from __future__ import annotations

import datetime
import os

import pytest
import torch

pytest.importorskip("safetensors")

import supervisor  # noqa: E402
from supervisor import CheckpointManager, TrainingState, load_checkpoint, verify_checkpoint  # noqa: E402
from supervisor.errors import CheckpointCorruptError, CheckpointError  # noqa: E402
from tests.cli.helpers import cli, cli_json, flip_byte  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # the optimizer has state: tensors, ints, floats, tuples (betas), nested dicts
    return model, opt, TrainingState.from_arguments(model=model, optimizer=opt)


class _Dated:
    def state_dict(self):
        return {"when": datetime.datetime(2026, 11, 29)}

    def load_state_dict(self, state_dict):
        pass


def _save(logdir, steps=(10, 20), **kwargs):
    model, opt, state = _state(0)
    manager = CheckpointManager(str(logdir), checkpoint_format="safetensors", save_mode="sync", **kwargs)
    manager.open()
    try:
        for step in steps:
            manager.save(step, state)
    finally:
        manager.close()
    return model, opt


def test_saved_restored_and_read_without_pickle(tmp_path):
    model, opt = _save(tmp_path)
    path = tmp_path / "model.ckpt-20"
    assert sorted(os.listdir(path)) == ["MANIFEST.json", "state.safetensors"]
    assert b"pickle" not in (path / "state.safetensors").read_bytes()[:64] and verify_checkpoint(str(path)).step == 20

    fresh_model, fresh_opt, fresh = _state(1)
    manager = CheckpointManager(str(tmp_path), checkpoint_format="safetensors")
    manager.open()
    try:
        restored = manager.restore(fresh)
    finally:
        manager.close()
    assert restored.global_step == 20
    for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert fresh_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]  # betas: a tuple again
    torch.testing.assert_close(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert load_checkpoint(str(path))["global_step"] == 20

    reader = supervisor.CheckpointReader(str(path))
    assert reader.get_variable_to_shape_map()["model/0.weight"] == (8, 4)
    torch.testing.assert_close(reader.get_tensor("model/0.weight"), model[0].weight.detach())


def test_the_cli_lists_verifies_and_inspects_it_and_a_damaged_one_is_refused(tmp_path):
    _save(tmp_path)
    result, rows = cli_json("ls", tmp_path)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["verified"]) for r in rows] == [(10, True), (20, True)]
    result, obj = cli_json("inspect", tmp_path)
    assert result.returncode == 0, result.stderr
    assert {v["name"]: v["shape"] for v in obj["variables"]}["model/2.weight"] == [2, 8]
    assert cli("verify", tmp_path / "model.ckpt-20").returncode == 0

    flip_byte(tmp_path / "model.ckpt-20" / "state.safetensors")
    assert cli("verify", tmp_path / "model.ckpt-20").returncode != 0
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        load_checkpoint(str(tmp_path / "model.ckpt-20"))
    _, fresh_opt, fresh = _state(1)
    manager = CheckpointManager(str(tmp_path), checkpoint_format="safetensors")
    manager.open()
    try:
        assert manager.restore(fresh).global_step == 10  # the damaged newest is skipped, as for every format
    finally:
        manager.close()


def test_a_format_the_manager_cannot_write_and_a_value_it_cannot_store_are_named(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_format='npz' is not a checkpoint format"):
        CheckpointManager(str(tmp_path), checkpoint_format="npz")
    with pytest.raises(ValueError, match="checkpoint_format='dcp': CheckpointManager cannot write"):
        CheckpointManager(str(tmp_path), checkpoint_format="dcp")
    manager = CheckpointManager(str(tmp_path / "x"), checkpoint_format="safetensors", save_mode="sync")
    manager.open()
    try:
        with pytest.raises(CheckpointError, match="extra/when is a datetime: save it as one of those"):
            manager.save(1, TrainingState({"extra": _Dated()}))
    finally:
        manager.close(failed=True)
