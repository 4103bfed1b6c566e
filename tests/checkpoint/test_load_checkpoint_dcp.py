"""`load_checkpoint` is the one public loader for every format (SPEC §5.8, issue 22 item 9): on a
sharded (``checkpoint_format="dcp"``) checkpoint it returns the full tensors, as `load_into` loads
them, read through the verified path (`supervisor.checkpoint.load.loader`)."""
from __future__ import annotations

import os

import pytest
import torch

from supervisor import load_checkpoint, restore_partial
from supervisor.checkpoint.sharded import load_into
from supervisor.errors import CheckpointCorruptError
from tests.estimator.sidecar_helpers import make_model
from tests.estimator.test_sidecar_dcp import train_sharded

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(120)]


def test_load_checkpoint_of_a_sharded_checkpoint_returns_the_full_tensors(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=4)
    path = os.path.join(logdir, "model.ckpt-4")
    payload = load_checkpoint(path)
    reference = make_model(8)
    assert load_into(path, reference) == 4
    assert payload["global_step"] == 4
    assert payload["model"].keys() == reference.state_dict().keys()
    assert all(torch.equal(payload["model"][k], v) for k, v in reference.state_dict().items())
    assert payload["optimizer"]["param_groups"][0]["lr"] == 0.01
    assert load_checkpoint(path, verify="size")["global_step"] == 4
    # restore_partial builds on it: a warm start from a sharded run works too.
    target = make_model(8)
    report = restore_partial(path, target)
    assert set(report.loaded) == set(reference.state_dict())
    assert all(torch.equal(target.state_dict()[k], v) for k, v in reference.state_dict().items())


def test_load_checkpoint_of_a_damaged_sharded_checkpoint_is_corrupt(tmp_path):
    logdir = str(tmp_path / "run")
    train_sharded(logdir, steps=4)
    shard = os.path.join(logdir, "model.ckpt-4", "__0_0.distcp")
    with open(shard, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointCorruptError, match="__0_0.distcp checksum"):
        load_checkpoint(os.path.dirname(shard))
