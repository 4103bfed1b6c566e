"""The sidecar evaluator on an ``s3://`` logdir (issue 24 item 6, SPEC §10.4, §16), against a real
S3-compatible server (moto over HTTP, the real s3fs client): it follows the index at the URL,
evaluates each of 3 checkpoints exactly once (each read once, verified: bytes read <= 1.0x its
size), writes its events under ``<url>/eval`` and exits at the trainer's finished mark."""
from __future__ import annotations

import threading
import time

import pytest
import torch

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import supervisor  # noqa: E402 - after the skip
from supervisor.checkpoint.layout.finished import mark_finished  # noqa: E402
from supervisor.checkpoint.storage import storage_for  # noqa: E402
from supervisor.estimator.evaluation import EvaluationLoop, StopReason  # noqa: E402
from supervisor.estimator.sidecar import SidecarEvaluator  # noqa: E402
from supervisor.events import read_scalars  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _model(step: int = 0) -> torch.nn.Module:
    torch.manual_seed(step)
    return torch.nn.Linear(8, 2)


def _batches() -> list:
    torch.manual_seed(99)
    return [(torch.randn(4, 8), torch.randn(4, 2)) for _ in range(2)]


def _eval_step(model, batch):
    x, y = batch
    return {"loss": torch.nn.functional.mse_loss(model(x), y)}


def _finish(url: str, opts: dict, step: int) -> None:
    mark_finished(url, step=step, checkpoint=f"{url}/model.ckpt-{step}", storage=storage_for(url, opts))


def _wait_for(predicate, secs: float = 30) -> None:
    deadline = time.monotonic() + secs
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sidecar_on_url_evaluates_each_of_three_checkpoints_once_and_exits_at_finished(s3_server, s3_root):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    evaluator = SidecarEvaluator(_model(), _batches(), url, eval_step=_eval_step, poll_secs=0.05,
                                 storage_options=opts, timeout=60)
    results: list = []
    thread = threading.Thread(target=lambda: results.extend(evaluator.evaluations()), daemon=True)
    thread.start()
    with supervisor.CheckpointManager(url, storage_options=opts, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, supervisor.TrainingState.from_arguments(model=_model(step)))
            if step < 3:  # the sidecar sees each one before the next is saved
                _wait_for(lambda: step in read_scalars(url + "/eval", opts))
    _finish(url, opts, 3)
    thread.join(60)
    assert not thread.is_alive(), "the sidecar did not exit after the finished mark"
    assert evaluator.stop_reason == StopReason.FINISHED
    assert [r.step for r in results] == [1, 2, 3]
    assert evaluator.stats.evaluated == 3 and evaluator.stats.corrupt == 0
    assert evaluator.checkpoint_dir == url and evaluator.log_dir == url + "/eval"
    assert sorted(read_scalars(url + "/eval", opts)) == [1, 2, 3]
    # A second sidecar on the same URL finds the events there and evaluates nothing again.
    again = SidecarEvaluator(_model(), _batches(), url, eval_step=_eval_step, poll_secs=0.05,
                             storage_options=opts, timeout=30)
    assert again.start() == [] and again.stop_reason == StopReason.FINISHED


def test_evaluation_loop_reads_each_checkpoint_once_verified(s3_server, s3_root):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    seen: list[tuple[int, int, int]] = []
    storage = storage_for(url, opts)

    def evaluate(ckpt):  # the checkpoint's size: its data objects and its manifest
        size = sum(record.size for record in ckpt.manifest.files.values())
        size += storage.stat(storage.join(ckpt.path, "MANIFEST.json")).size
        seen.append((ckpt.step, ckpt.bytes_read, size))
        return {}

    loop = EvaluationLoop(url, evaluate, poll_secs=0.01, timeout=0, storage_options=opts)
    with supervisor.CheckpointManager(url, storage_options=opts, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, supervisor.TrainingState.from_arguments(model=_model(step)))
            assert [r.step for r in loop] == [step]
    assert [s for s, _, _ in seen] == [1, 2, 3]
    assert all(0 < read <= size for _, read, size in seen), seen  # read once: <= 1.0x the data's size


def test_url_arguments_are_checked(s3_server, s3_root, tmp_path):
    opts = options(s3_server.endpoint)
    with pytest.raises(ValueError, match="checkpoint_dir.*gcsx"):
        EvaluationLoop("gcsx://bucket/run", lambda c: {})
    with pytest.raises(ValueError, match="storage_options"):
        EvaluationLoop(str(tmp_path), lambda c: {}, storage_options=opts)
    evaluator = SidecarEvaluator(_model(), _batches(), s3_root + "/run/", storage_options=opts,
                                 log_dir=s3_root + "/evals/a")
    assert evaluator.checkpoint_dir == s3_root + "/run" and evaluator.log_dir == s3_root + "/evals/a"
    with pytest.raises(ValueError, match="log_dir"):
        SidecarEvaluator(_model(), _batches(), s3_root + "/run", storage_options=opts, log_dir=s3_root + "/run")
