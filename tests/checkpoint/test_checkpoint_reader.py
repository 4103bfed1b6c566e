"""The reader API (TF's list_variables / load_variable / CheckpointReader) on real checkpoints."""
from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch import nn

import supervisor
from supervisor import CheckpointReader, list_variables, load_variable


def _save(logdir, step=5, model=None):
    torch.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    manager = supervisor.CheckpointManager(str(logdir), save_mode="sync")
    manager.open()
    try:
        path = manager.save(step, supervisor.TrainingState.from_arguments(model=model, optimizer=optimizer))
    finally:
        manager.close()
    return path, model, optimizer


def test_names_are_entry_slash_state_dict_key(tmp_path):
    path, model, _ = _save(tmp_path)
    variables = dict(list_variables(path))
    assert variables["model/0.weight"] == (4, 3) and variables["model/2.bias"] == (2,)
    assert variables["global_step"] == ()
    assert variables["optimizer/state/0/exp_avg"] == (4, 3)
    assert variables["optimizer/param_groups/0/params"] == (4,)  # a list of numbers is one variable
    assert not [n for n in variables if n.startswith("__meta__")]
    assert {n[len("model/"):] for n in variables if n.startswith("model/")} == set(model.state_dict())


def test_load_variable_returns_one_exact_value(tmp_path):
    path, model, _ = _save(tmp_path, step=7)
    assert torch.equal(load_variable(path, "model/0.weight"), model.state_dict()["0.weight"])
    assert load_variable(path, "global_step").item() == 7
    lr = load_variable(path, "optimizer/param_groups/0/lr")
    assert lr.dtype == torch.float64 and lr.item() == 1e-3  # Python floats are not rounded to float32
    with pytest.raises(KeyError, match="model/0.weight"):
        load_variable(path, "model/0.kernel")


def test_a_logdir_means_its_latest_checkpoint_and_copies_outlive_it(tmp_path):
    path, _, _ = _save(tmp_path, step=3)
    with CheckpointReader(tmp_path) as reader:
        assert reader.path == path and reader.step == 3
        weight = reader.get_tensor("model/0.weight")
        assert reader.has_tensor("model/0.bias") and not reader.has_tensor("model/9.bias")
        assert reader.get_variable_to_dtype_map()["model/0.weight"] == torch.float32
    expected = supervisor.load_checkpoint(path)["model"]["0.weight"]
    shutil.rmtree(path)
    assert torch.equal(weight, expected)  # the returned copy stays valid after the checkpoint is gone
    with pytest.raises(supervisor.CheckpointNotFoundError):
        list_variables(tmp_path)


def test_plain_torch_save_file(tmp_path):
    model = nn.Linear(2, 2)
    torch.save(model.state_dict(), tmp_path / "pretrained.pt")
    assert dict(list_variables(tmp_path / "pretrained.pt")) == {"weight": (2, 2), "bias": (2,)}
    assert torch.equal(load_variable(tmp_path / "pretrained.pt", "bias"), model.bias.detach())


def test_damaged_or_missing_checkpoints_raise_named_errors(tmp_path):
    path, _, _ = _save(tmp_path)
    with open(os.path.join(path, "state.pt"), "r+b") as f:
        f.truncate(64)
    with pytest.raises(supervisor.CheckpointCorruptError, match="truncated"):
        list_variables(path)
    with pytest.raises(supervisor.CheckpointNotFoundError, match="no checkpoint at"):
        list_variables(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="verify must be one of"):
        CheckpointReader(path, verify="quick")


def test_names_match_what_restore_partial_loads(tmp_path):
    path, model, _ = _save(tmp_path)
    target = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 5))  # another head
    report = supervisor.restore_partial(path, target, include="0.*")
    assert set(report.loaded) == {n[len("model/"):] for n, _ in list_variables(path) if n.startswith("model/0.")}
    assert torch.equal(target[0].weight, load_variable(path, "model/0.weight"))


def _sealed_dcp_checkpoint(logdir, model, optimizer, step):
    """A committed checkpoint in the ``checkpoint_format="dcp"`` layout: DCP files + manifest."""
    import time

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from supervisor.checkpoint.storage.fileio import checksum_file
    from supervisor.checkpoint.layout.format import FileRecord, Manifest

    path = os.path.join(str(logdir), f"model.ckpt-{step}")
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=path, no_dist=True)
    files = {name: FileRecord(*checksum_file(os.path.join(path, name))) for name in sorted(os.listdir(path))}
    manifest = Manifest(step=step, wall_time=time.time(), torch_version=torch.__version__, world_size=1, files=files)
    with open(os.path.join(path, "MANIFEST.json"), "w", encoding="utf-8") as f:
        f.write(manifest.to_json())
    return path


def test_dcp_checkpoints_are_read_one_tensor_at_a_time(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    path = _sealed_dcp_checkpoint(tmp_path, model, optimizer, step=9)
    variables = dict(list_variables(tmp_path))
    assert variables["global_step"] == () and variables["model/0.weight"] == (4, 3)
    assert variables["optimizer/state/0.weight/exp_avg"] == (4, 3)  # DCP keys optimizer state by name
    assert load_variable(path, "global_step").item() == 9
    assert torch.equal(load_variable(path, "model/2.bias"), model[2].bias.detach())
    assert torch.equal(load_variable(path, "optimizer/state/0.weight/exp_avg"),
                       optimizer.state[model[0].weight]["exp_avg"])


def test_list_variables_is_sorted_by_name_as_tf_lists_them(tmp_path):
    """TF's ``list_variables`` returns names sorted (its reader tests rely on it), not save order."""
    path, _, _ = _save(tmp_path)
    names = [name for name, _ in list_variables(path)]
    assert names == sorted(names)
    torch.save({"z": torch.zeros(1), "a": torch.zeros(2), "m": {"b": torch.zeros(3), "a": torch.zeros(4)}},
               tmp_path / "plain.pt")
    assert list_variables(tmp_path / "plain.pt") == [("a", (2,)), ("m/a", (4,)), ("m/b", (3,)), ("z", (1,))]
