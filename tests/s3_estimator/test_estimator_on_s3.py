"""`Estimator` on an ``s3://`` model_dir end to end (SPEC §10, §16; issue 24 items 1, 6) against a
real moto server: train, evaluate (eval events under ``<model_dir>/eval_<name>``, read back by
TensorBoard's `EventAccumulator` and by `read_scalars`), `latest_checkpoint`,
`get_variable_names`/`get_variable_value`, predict, and nothing written locally."""
from __future__ import annotations

import os

import pytest
import torch

from supervisor.estimator import RunConfig
from supervisor.events import read_scalars
from tests.estimator.estimator_toy import batches, endless, eval_scalars, make_estimator
from tests.s3_fixtures import options

pytestmark = pytest.mark.timeout(120)


def s3_estimator(url, opts, *, save_steps=5, **kwargs):
    config = RunConfig(url, save_checkpoints_steps=save_steps, log_step_count_steps=0, save_summary_steps=0,
                       storage_options=opts)
    return make_estimator(url, config=config, **kwargs)


def download(storage, url, directory):
    """Every object under ``url`` copied into ``directory`` (what a synced TensorBoard logdir holds)."""
    for name in storage.list_files(url):
        target = os.path.join(directory, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(storage.read_bytes(storage.join(url, name)))


def test_train_evaluate_variables_and_predict_on_s3(s3_server, s3_root, s3_storage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    est = s3_estimator(url, opts, predict_step=lambda model, batch: model(batch[0]))
    est.train(endless(), max_steps=5)
    assert est.latest_checkpoint() == url + "/model.ckpt-5"
    metrics = est.evaluate(lambda: batches(), steps=3, name="val")
    assert metrics["global_step"] == 5 and set(metrics) == {"loss", "accuracy", "global_step"}
    again = est.evaluate(lambda: batches(), name="val", checkpoint_path=url + "/model.ckpt-5")
    assert again["global_step"] == 5
    # the eval events: the project's reader on the URL, and TensorBoard on a synced copy
    recorded = read_scalars(est.eval_dir("val"), storage_options=opts)
    assert recorded[5]["loss"] == pytest.approx(again["loss"])
    local = tmp_path / "tb"
    download(s3_storage, est.eval_dir("val"), local)
    assert [step for step, _ in eval_scalars(str(local))["loss"]] == [5, 5]
    # variables, read from the URL without loading the whole state
    names = est.get_variable_names()
    assert "model/0.weight" in names and "global_step" in names
    assert torch.equal(est.get_variable_value("model/0.weight"), est.model[0].weight.detach())
    predictions = list(est.predict(lambda: batches()))
    assert len(predictions) == 96
    assert sorted(os.listdir(tmp_path)) == ["tb"]  # nothing else written locally
