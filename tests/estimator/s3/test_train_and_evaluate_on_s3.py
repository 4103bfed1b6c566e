"""`train_and_evaluate` on an ``s3://`` model_dir (SPEC §10.2, §10.3, §16) against a real moto
server: local mode with Best and Final exporters writing to ``<model_dir>/export/<name>`` on the
object store (Latest: test_exports_on_s3.py), a rerun of the finished job that reads what was
evaluated and exported back from the URL, a `BestExporter` new to the process recovering its bar
from the exports' records there, and the evaluator task following the trainer's checkpoints."""
from __future__ import annotations

import os

import pytest

from supervisor.checkpoint.storage import resolve_location
from supervisor.estimator import BestExporter, EvalSpec, FinalExporter, RunConfig, TrainSpec
from supervisor.estimator import train_and_evaluate
from supervisor.estimator.exporters import list_exports
from supervisor.estimator.training import exported_steps
from supervisor.events import read_scalars
from supervisor.testing import FakeClock
from tests.estimator.estimator_toy import batches, endless, make_estimator
from tests.estimator.s3.helpers import options, s3_estimator

pytestmark = pytest.mark.timeout(180)


def local_spec():
    return EvalSpec(lambda: batches(), steps=2, throttle_secs=0,
                    exporters=[BestExporter("best", exports_to_keep=1), FinalExporter("final")])


def test_train_and_evaluate_on_s3_local_rerun_best_recovery_and_evaluator_task(s3_server, s3_root, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    est = s3_estimator(url, opts, save_steps=10, clock=FakeClock())
    metrics, (best, final) = train_and_evaluate(est, TrainSpec(endless(), max_steps=10), local_spec())
    assert metrics["global_step"] == 10 and sorted(read_scalars(est.eval_dir(), storage_options=opts)) == [10]
    assert best.startswith(url + "/export/best/") and final.startswith(url + "/export/final/")
    assert [p for _, p in list_exports(url + "/export/final", opts)] == [final]
    # a rerun of the finished job: what was evaluated and exported is read back from the URL
    rerun = s3_estimator(url, opts, save_steps=10, clock=FakeClock())
    assert train_and_evaluate(rerun, TrainSpec(endless(), max_steps=10), local_spec()) == (metrics, (None, None))
    assert exported_steps(resolve_location(url + "/export/best", opts)) == {10}
    # a BestExporter new to the process: its bar is the export's record on s3
    worse = dict(metrics, loss=metrics["loss"] + 1.0)
    assert BestExporter("best").export(rerun, url + "/export/best", final, worse, False) is None
    # the evaluator task on the same URL (the run is marked finished): evaluates, exports as final, exits
    config = RunConfig(url, task_type="evaluator", log_step_count_steps=0, save_summary_steps=0, storage_options=opts)
    spec = EvalSpec(lambda: batches(), steps=2, name="task", start_delay_secs=0, throttle_secs=0,
                    exporters=[FinalExporter("task_final")])
    evaluator = make_estimator(url, config=config, clock=FakeClock())
    task_metrics, (task_export,) = train_and_evaluate(evaluator, TrainSpec(endless()), spec)
    assert task_metrics["global_step"] == 10 and task_export.startswith(url + "/export/task_final/")
    assert sorted(read_scalars(url + "/eval_task", storage_options=opts)) == [10]
    restarted = make_estimator(url, config=config, clock=FakeClock())
    assert train_and_evaluate(restarted, TrainSpec(endless()), spec) == (None, None)  # step 10 was done
    assert os.listdir(tmp_path) == []  # nothing written locally
