"""A non-chief process without a process group (``is_chief=False`` alone) on an ``s3://``
logdir (SPEC §4, §16; issue 24 item 1): it waits for the chief's first checkpoint on the URL —
read with its ``storage_options`` — and restores it; the wait ends at once on SIGTERM or
``request_stop()``, and its timeout names the URL. Its client is configured by
``storage_options=`` only: the child's environment has no ``AWS_*``."""
from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
import time

import pytest
import torch

from hooks import StopAtStepHook

from supervisor import (CheckpointManager, Hook, MonitoredTrainingSession, Supervisor, TrainingState,
                        WorkerSessionCreator)
from supervisor.estimator import Estimator, RunConfig
from supervisor.errors import StopRequestedError
from tests import forked_io, zygote
from tests.s3_fixtures import options
from tests.frontdoors.s3.models import build, digest, train_step
from tests.distributed.s3.test_ranks_storage_options import NO_CLIENT_CONFIG

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


class Child:
    """``lone_worker.py`` in a subprocess; its output read without blocking (every wait bounded)."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_S3"))}
        env.update(NO_CLIENT_CONFIG, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
        out = forked_io.new_file(tempfile.gettempdir(), "lone-worker")  # ``python -u``, forked (tests/zygote.py)
        self.proc = zygote.Forked(os.path.join(HERE, "lone_worker.py"), args, cwd=ROOT, output=out,
                                  env=forked_io.unbuffered(env))

    @property
    def output(self) -> str:
        return forked_io.output(self.proc)

    def wait_for(self, text: str, timeout_secs: float) -> None:
        forked_io.wait_for(self.proc, text, timeout_secs)

    def finish(self, timeout_secs: float) -> int:
        return self.proc.wait(timeout=timeout_secs)

    def kill(self) -> None:
        forked_io.finish(self.proc, timeout=30)


def _chief_saving_once(url: str, opts: dict, step: int) -> str:
    """The chief trains ``step`` steps, then commits its one checkpoint (a session would also
    save at step 0, which a worker polling meanwhile may restore first: the first one is what
    it waits for)."""
    model, optimizer = build(seed=0)
    with CheckpointManager(url, storage_options=opts) as manager:
        for _ in range(step):
            train_step(model, optimizer)
        manager.save(step, TrainingState.from_arguments(model=model, optimizer=optimizer), wait=True)
    return digest(model, optimizer)


def _chief(url: str, opts: dict, last_step: int) -> str:
    model, optimizer = build(seed=0)
    with MonitoredTrainingSession(url, model, optimizer, storage_options=opts, save_checkpoint_steps=100,
                                  hooks=[StopAtStepHook(last_step=last_step)], handle_signals=False,
                                  log_step_count_steps=None, save_summaries_steps=None) as s:
        while not s.should_stop():
            s.run(train_step, model, optimizer)
    return digest(model, optimizer)


@pytest.mark.slow  # a subprocess (forked from the zygote) on a moto server
def test_a_lone_worker_stops_at_once_on_sigterm_then_waits_for_and_restores_the_chiefs_checkpoint(
        s3_server, s3_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty, url, opts = s3_root + "/nothing-yet", s3_root + "/run", options(s3_server.endpoint)
    child = Child(empty, url, json.dumps(opts))
    try:
        child.wait_for(f"waiting for the chief's checkpoint in {empty}", 60)
        start = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        child.wait_for(f"chief's first verified checkpoint in {empty}; nothing was restored", 10)
        assert time.monotonic() - start < 5, child.output  # at once, not after a poll or max_wait_secs
        assert "STOPPED: stopped (a stop signal (SIGTERM/SIGINT)) after waiting" in child.output

        child.wait_for(f"waiting for the chief's checkpoint in {url}", 30)
        chief_digest = _chief_saving_once(url, opts, step=5)  # the worker waits while the chief trains
        assert child.finish(60) == 0, child.output
    finally:
        child.kill()
    result = json.loads(child.output.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"step": 5, "digest": chief_digest}, child.output
    assert f"restored step=5 from {url}/model.ckpt-5" in child.output
    assert os.listdir(tmp_path) == []  # nothing written locally (no "s3:" directory)


def _lone_worker(url: str, opts: dict, **kwargs) -> Supervisor:
    model, optimizer = build(seed=1)
    return Supervisor(url, model, optimizer, is_chief=False, storage_options=opts, save_model_secs=0,
                      save_summaries_secs=0, handle_signals=False, **kwargs)


def test_a_lone_workers_timeout_names_the_url(s3_server, s3_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = s3_root + "/run"
    sv = _lone_worker(url, options(s3_server.endpoint), max_wait_secs=0.6, recovery_wait_secs=0.2)
    with pytest.raises(TimeoutError) as info:
        with sv.managed_session():
            pass
    message = str(info.value)
    assert f"chief's first verified checkpoint in {url};" in message and "max_wait_secs=0.6" in message
    assert os.listdir(tmp_path) == []


def test_request_stop_ends_a_lone_workers_wait_at_once(s3_server, s3_root):
    url = s3_root + "/run"
    sv = _lone_worker(url, options(s3_server.endpoint), max_wait_secs=120, recovery_wait_secs=30)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with sv.managed_session():
                pass
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    looked = threading.Event()

    class _Looked(logging.Handler):  # the worker's line right before it waits for its next look, 30 s away
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for the chief's checkpoint"):
                looked.set()

    handler, worker_logger = _Looked(), logging.getLogger("supervisor.creators.worker")
    level = worker_logger.level
    worker_logger.addHandler(handler)
    worker_logger.setLevel(logging.INFO)
    thread = threading.Thread(target=work, name="lone-worker")
    try:
        thread.start()
        assert looked.wait(60), f"the worker never looked: {errors}"
    finally:
        worker_logger.removeHandler(handler)
        worker_logger.setLevel(level)
    start = time.monotonic()
    sv.request_stop()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - start < 5
    assert len(errors) == 1 and isinstance(errors[0], StopRequestedError), errors
    assert f"chief's first verified checkpoint in {url}; nothing was restored" in str(errors[0])


class _SeeStart(Hook):
    """Records the step and the state digest a session starts from."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.state, self.start = (model, optimizer), None

    def after_create_session(self, session, coord) -> None:
        self.start = (session.global_step, digest(*self.state))


def test_mts_and_estimator_workers_restore_the_chiefs_checkpoint_with_storage_options(
        s3_server, s3_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    chief_digest = _chief(url, opts, last_step=3)
    model, optimizer = build(seed=1)
    with MonitoredTrainingSession(url, model, optimizer, is_chief=False, storage_options=opts,
                                  handle_signals=False, max_wait_secs=10) as s:
        assert s.global_step == 3 and not s.is_chief and s.checkpoint_manager is None
    assert digest(model, optimizer) == chief_digest

    model, optimizer = build(seed=2)
    seen = _SeeStart(model, optimizer)
    config = RunConfig(url, task_type="worker", task_id=1, storage_options=opts)
    estimator = Estimator(model=model, optimizer=optimizer, config=config,
                          train_step=lambda batch: train_step(model, optimizer))
    estimator.train(lambda: iter(range(100)), max_steps=5, hooks=[seen])
    assert seen.start == (3, chief_digest)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("directory, storage_options, error, match", [
    ("local", {"endpoint_url": "http://127.0.0.1:1"}, ValueError, "storage_options=.*local path"),
    ("s3://", None, ValueError, "names no bucket"),
    ("gs2://bucket/run", None, ValueError, "gs2"),
])
def test_a_workers_directory_and_storage_options_are_checked_at_construction(tmp_path, directory, storage_options,
                                                                             error, match):
    path = str(tmp_path / directory) if directory == "local" else directory
    with pytest.raises(error, match=match):
        WorkerSessionCreator(TrainingState({"model": torch.nn.Linear(2, 1)}), path, storage_options=storage_options)
