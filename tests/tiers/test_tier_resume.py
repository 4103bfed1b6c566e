"""Resuming from the local tier without waiting for the logdir (SPEC §17, issue 33): the first
step runs before the logdir is asked anything (a gated loopback proxy in front of a real S3
server holds its requests); nothing is persisted before the lease is held; a second writer is
still refused, once the logdir opens after the first step; a logdir another writer moved on since
this node's record stops the session, and the next start restores the logdir's newest."""
from __future__ import annotations

import http.server
import logging
import os
import threading

import pytest
import torch

import supervisor
from hooks import StopAtStepHook
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.tiers import persist
from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
from supervisor.checkpoint.tiers.record import RECORD_FILE
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.errors import CheckpointError, LogdirInUseError
from supervisor.state import TrainingState
from tests.s3_fixtures import forward, make_bucket, options

pytestmark = pytest.mark.timeout(900)

HOLD_SECS = 30.0  # the gate's bound: a request held longer is forwarded anyway (and counted)


class GateProxy:
    """A loopback proxy that holds every request while ``gate`` is clear (at most `HOLD_SECS`),
    then forwards it; ``waiting``: requests held now; ``answered``: requests forwarded."""

    def __init__(self, upstream_port: int) -> None:
        self.gate, self.lock, self.waiting, self.answered, self.timed_out = threading.Event(), threading.Lock(), 0, 0, 0
        self.gate.set()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    proxy.waiting += 1
                released = proxy.gate.wait(HOLD_SECS)
                with proxy.lock:
                    proxy.waiting -= 1
                    proxy.timed_out += not released
                forward(self, upstream_port, body)
                with proxy.lock:
                    proxy.answered += 1

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-gate-proxy", daemon=True)

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.waiting, self.answered

    def __enter__(self) -> GateProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(8, 4)


def _train(logdir, local, storage_options, model, last_step, step_fn=None) -> list[int]:
    """A `MonitoredTrainingSession` with tiers to ``last_step``; returns the global step seen at each step."""
    seen = []
    with supervisor.MonitoredTrainingSession(
            logdir, model, local_dir=local, persist_every_steps=2, save_checkpoint_steps=1,
            save_checkpoint_secs=None, storage_options=storage_options, save_summaries_steps=None,
            log_step_count_steps=None, hooks=[StopAtStepHook(last_step=last_step)]) as session:
        while not session.should_stop():
            seen.append(session.global_step)
            if step_fn is not None:
                step_fn(session)
            session.run(lambda: model.weight.data.add_(1.0))
    return seen


class WorkerWaits(logging.Handler):
    """``parked`` is set when the persist worker says its open of the logdir waits (a handshake)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.parked = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "waits to open the logdir" in record.getMessage():
            self.parked.set()

    def __enter__(self) -> WorkerWaits:
        log = logging.getLogger(persist.__name__)
        self._level = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        log = logging.getLogger(persist.__name__)
        log.removeHandler(self)
        log.setLevel(self._level)


def test_the_first_step_runs_before_the_logdir_is_asked_anything(s3_server, s3_storage, tmp_path):
    local = str(tmp_path / "local")
    with GateProxy(s3_server.port) as proxy:
        logdir, storage_options = make_bucket(s3_storage) + "/run", options(proxy.endpoint, read_timeout=120)
        _train(logdir, local, storage_options, _model(0), last_step=4)
        expected = _model(0).weight.detach().clone()
        for _ in range(4):  # the four steps, as they ran (bit for bit)
            expected.add_(1.0)
        observed = {}

        def first_step(session) -> None:
            if observed:
                return
            observed["weight"] = resumed.weight.detach().clone()  # what the restore put there
            observed["parked"] = waits.parked.wait(HOLD_SECS)  # handshake: the worker waits to open
            observed["counts"] = proxy.counts()
            proxy.gate.set()

        resumed = _model(1)
        proxy.gate.clear()
        answered_before = proxy.counts()[1]
        with WorkerWaits() as waits:
            seen = _train(logdir, local, storage_options, resumed, last_step=7, step_fn=first_step)
        assert proxy.timed_out == 0, "the session waited for the logdir until the gate gave up"
    waiting, answered = observed["counts"]
    assert seen[0] == 4 and torch.equal(observed["weight"], expected) and observed["parked"]
    assert waiting == 0 and answered == answered_before, (
        f"before the first step the logdir was asked {waiting} request(s), answered {answered - answered_before}")
    index = read_index(logdir, storage=s3_storage)
    assert os.path.basename(index.model_checkpoint_path) == "model.ckpt-7"  # persisted once the lease was held
    assert os.path.exists(os.path.join(local, RECORD_FILE))


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    return TrainingState.from_arguments(model=torch.nn.Linear(4, 3))


def _manager(backend_logdir, local, **kwargs) -> TieredCheckpointManager:
    _, logdir, storage_options = backend_logdir
    return TieredCheckpointManager(logdir, local_dir=str(local), save_mode="sync", persist_every_steps=1,
                                   storage_options=storage_options, **kwargs)


def test_a_logdir_moved_on_by_another_writer_stops_the_session_and_the_next_start_waits_for_it(
        backend_logdir, tmp_path, monkeypatch):
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    with _manager(backend_logdir, node_a) as a:
        for step in range(3):
            a.save(step, _state(step))
    with _manager(backend_logdir, node_b) as b:  # the job moved to another node: it resumes there
        assert b.restore(_state(9)).global_step == 2
        for step in range(3, 7):
            b.save(step, _state(step))
    gate, real = threading.Event(), persist.acquire_writer_lock

    def gated(*args, **kwargs):
        assert gate.wait(60)
        return real(*args, **kwargs)
    monkeypatch.setattr(persist, "acquire_writer_lock", gated)
    errors = []
    a = _manager(backend_logdir, node_a)  # back on node A, whose local tier stopped at step 2
    a.open()
    a.on_error = errors.append
    assert a.restore(_state(9)).global_step == 2  # its record said the logdir held step 2
    gate.set()
    with pytest.raises(CheckpointError, match="holds step 6, newer than step 2"):
        a.persister.wait_open(60)
    with pytest.raises(CheckpointError, match="holds step 6"):
        a.close()
    assert len(errors) == 1 and not (node_a / RECORD_FILE).exists()
    with _manager(backend_logdir, node_a) as a:  # the next start waits for the logdir
        restored = a.restore(_state(9))
        assert restored.global_step == 6 and restored.path.startswith(backend_logdir[1])


def test_a_second_writer_is_refused_when_the_logdir_opens_after_the_first_step(backend_logdir, tmp_path):
    storage, logdir, storage_options = backend_logdir
    with _manager(backend_logdir, tmp_path / "node") as a:
        for step in range(3):
            a.save(step, _state(step))
    other = CheckpointManager(logdir, storage_options=storage_options)  # another writer holds the lock/lease
    other.open()
    try:
        manager, failed, errors = _manager(backend_logdir, tmp_path / "node"), threading.Event(), []
        manager.on_error = lambda error: (errors.append(error), failed.set())
        creator = supervisor.CheckpointSessionCreator(_state(9), manager)
        with pytest.raises(CheckpointError, match="opening the logdir .* failed") as raised:
            with supervisor.MonitoredSession(creator) as session:
                assert session.global_step == 2 and not failed.is_set()  # restored from the local tier
                session.run(lambda: None)  # no save: the first step's boundary starts the open
                assert failed.wait(60), "the logdir was not opened after the first step"
                session.run(lambda: None)
    finally:
        other.close()
    assert isinstance(raised.value.__cause__, LogdirInUseError) and errors == [raised.value]
    assert read_index(logdir, storage=storage).model_checkpoint_path.endswith("model.ckpt-2")  # nothing persisted
