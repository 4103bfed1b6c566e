"""`train_and_evaluate` on an ``s3://`` model_dir (SPEC §10.2, §10.3, §16) against a real moto
server: local mode with Best and Final exporters (Latest: test_exports_on_s3.py) writing to ``<model_dir>/export/<name>`` on the
object store, the `BestExporter` recovering its bar from the exports' records there at a restart,
and the evaluator task following the trainer's checkpoints on the URL."""
from __future__ import annotations

import os

import pytest

from supervisor.estimator import BestExporter, EvalSpec, FinalExporter, RunConfig, TrainSpec
from supervisor.estimator import train_and_evaluate
from supervisor.estimator.exporters import list_exports
from supervisor.estimator.training import exported_steps
from supervisor.events import read_scalars
from supervisor.testing import FakeClock
from tests.estimator.estimator_toy import batches, endless, make_estimator
from tests.s3_estimator.test_estimator_on_s3 import s3_estimator
from tests.s3_fixtures import options

pytestmark = pytest.mark.timeout(180)


def exporters():
    return [BestExporter("best", exports_to_keep=1), FinalExporter("final")]


def test_local_train_and_evaluate_exports_to_s3_and_best_survives_a_restart(s3_server, s3_root, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    spec = EvalSpec(lambda: batches(), steps=2, throttle_secs=0, exporters=exporters())
    est = s3_estimator(url, opts, save_steps=10, clock=FakeClock())
    metrics, (best, final) = train_and_evaluate(est, TrainSpec(endless(), max_steps=10), spec)
    assert metrics["global_step"] == 10 and sorted(read_scalars(est.eval_dir(), storage_options=opts)) == [10]
    assert best.startswith(url + "/export/best/") and final.startswith(url + "/export/final/")
    assert [p for _, p in list_exports(url + "/export/final", opts)] == [final]
    assert exported_steps(url + "/export/best", opts) == {10}
    # a restart with a longer run: the best exporter reads its bar back from the records on s3
    again = s3_estimator(url, opts, save_steps=10, clock=FakeClock())
    spec = EvalSpec(lambda: batches(), steps=2, throttle_secs=0, exporters=exporters())
    metrics, _ = train_and_evaluate(again, TrainSpec(endless(), max_steps=20), spec)
    losses = read_scalars(again.eval_dir(), storage_options=opts)
    assert metrics["global_step"] == 20 and sorted(losses) == [10, 20]
    (best_step,) = exported_steps(url + "/export/best", opts)  # exports_to_keep=1 on the object store
    assert losses[best_step]["loss"] == min(v["loss"] for v in losses.values())  # never a worse model
    assert exported_steps(url + "/export/final", opts) == {10, 20}
    assert os.listdir(tmp_path) == []  # nothing written locally


def test_the_evaluator_task_follows_an_s3_model_dir(s3_server, s3_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    s3_estimator(url, opts).train(endless(), max_steps=10)  # a clean end: the run is marked finished
    config = RunConfig(url, task_type="evaluator", log_step_count_steps=0, save_summary_steps=0, storage_options=opts)
    spec = EvalSpec(lambda: batches(), steps=2, start_delay_secs=0, throttle_secs=0, exporters=[FinalExporter()])
    evaluator = make_estimator(url, config=config, clock=FakeClock())
    metrics, (final_export,) = train_and_evaluate(evaluator, TrainSpec(endless()), spec)
    assert metrics["global_step"] == 10 and sorted(read_scalars(evaluator.eval_dir(), storage_options=opts)) == [10]
    assert final_export.startswith(url + "/export/final_exporter/")
    restarted = make_estimator(url, config=config, clock=FakeClock())
    assert train_and_evaluate(restarted, TrainSpec(endless()), spec) == (None, None)  # step 10 was done
    assert os.listdir(tmp_path) == []
