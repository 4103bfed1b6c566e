"""``checkpoint_format="safetensors"`` at a front door on an ``s3://`` logdir (issue 32), against a
real moto server: the format's file goes through the object store's `Storage` (nothing written
locally), a new session restores it bit-exact, and the CLI verifies and inspects it there."""
from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("safetensors")

from hooks import StopAtStepHook  # noqa: E402
from supervisor import CheckpointReader, MonitoredTrainingSession  # noqa: E402
from supervisor.cli import main  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402
from tests.frontdoors.s3.test_mts_on_s3 import _assert_same, _build, _train  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def test_safetensors_on_s3_saves_there_restores_bit_exact_and_the_cli_reads_it(s3_server, s3_root, s3_storage,
                                                                              tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    model, opt = _build()
    with MonitoredTrainingSession(url, model, opt, save_checkpoint_steps=4, storage_options=opts,
                                  checkpoint_format="safetensors", hooks=[StopAtStepHook(last_step=6)]) as s:
        _train(s, model, opt)
    rng_at_end = torch.get_rng_state()
    files = [f.rsplit("/", 1)[-1] for f in s3_storage.list_files(url + "/model.ckpt-6")]
    assert sorted(files) == ["MANIFEST.json", "state.safetensors"]
    assert os.listdir(tmp_path) == []  # nothing written locally

    cli_options = ["--storage-options", json.dumps(opts)]
    assert main(["verify", url + "/model.ckpt-6", *cli_options]) == 0
    capsys.readouterr()
    assert main(["inspect", url, "--json", *cli_options]) == 0
    shapes = {v["name"]: v["shape"] for v in json.loads(capsys.readouterr().out)["variables"]}
    assert shapes["model/0.weight"] == [8, 4]
    with CheckpointReader(url, storage_options=opts) as reader:  # a tensor on demand, under the data root
        assert torch.equal(reader.get_tensor("model/0.weight"), model[0].weight.detach())

    torch.manual_seed(123)
    model2, opt2 = _build()
    with MonitoredTrainingSession(url, model2, opt2, storage_options=opts, checkpoint_format="safetensors",
                                  save_checkpoint_steps=None, save_checkpoint_secs=None) as s:
        assert s.global_step == 6
        assert torch.equal(torch.get_rng_state(), rng_at_end)
        _assert_same(model2.state_dict(), model.state_dict())
        _assert_same(opt2.state_dict(), opt.state_dict())
