"""Fixtures of every object-store test: a real S3-compatible server (moto) on loopback, a fresh
bucket per test, both storage backends, and a fault-injecting HTTP proxy. A test folder uses them
with ``from tests.s3_fixtures import *`` in its conftest.py (see tests/storage/conftest.py).

The real ``s3fs``/``botocore`` client talks to the server over HTTP; nothing is mocked in-process.
"""
from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
import uuid
import zlib
from typing import Any, Callable, Iterator

import fsspec.asyn
import pytest

from benchmarks._s3_server import S3Server
from supervisor.checkpoint.storage import LocalStorage, storage_for

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER_START_SECS = 30.0
#: Small, bounded retries so a test of "the server never recovers" ends in seconds.
TEST_CONFIG = {"retries": {"mode": "standard", "total_max_attempts": 3}, "connect_timeout": 2, "read_timeout": 10}
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer(S3Server):
    """``moto``'s S3 server in a subprocess on a free loopback port: the benchmarks' launcher
    (`benchmarks._s3_server.S3Server`: writes serialised, the server exits with its starter)."""

    def __init__(self) -> None:
        super().__init__(timeout_secs=SERVER_START_SECS)


def options(endpoint: str, **config: object) -> dict:
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "config_kwargs": {**TEST_CONFIG, **config}, "skip_instance_cache": False}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    for module in ("s3fs", "moto"):
        pytest.importorskip(module, reason='the object-store tests need the test extra: pip install -e ".[test]"')
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    fsspec.asyn.get_loop()  # its IO thread lives as long as the process: start it outside any test
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_bucket(storage, name: str | None = None) -> str:
    bucket = name or f"t-{uuid.uuid4().hex[:20]}"
    storage.fs.call_s3("create_bucket", Bucket=bucket)
    return f"s3://{bucket}"


@pytest.fixture(scope="session")
def s3_storage(s3_server: MotoServer):
    """One client for the session (each test gets its own bucket)."""
    return storage_for("s3://x", options(s3_server.endpoint))


@pytest.fixture
def s3_root(s3_storage) -> str:
    """A fresh, empty bucket: ``s3://<bucket>``."""
    return make_bucket(s3_storage)


@pytest.fixture(params=["local", "s3"])
def backend_logdir(request, tmp_path):
    """``(storage, logdir, storage_options)`` for each backend: a local directory, or a prefix of
    a fresh bucket with the options a process needs to reach it."""
    if request.param == "local":
        return LocalStorage(), str(tmp_path / "logdir"), None
    storage, server = request.getfixturevalue("s3_storage"), request.getfixturevalue("s3_server")
    return storage, make_bucket(storage) + "/logdir", options(server.endpoint)


@pytest.fixture(params=["local", "s3", "memory"])
def backend(request, tmp_path):
    """``(storage, root)`` for each backend: a temp directory, a fresh bucket, a fresh bucket of
    the in-process ``memory://`` storage."""
    if request.param == "local":
        yield LocalStorage(), str(tmp_path)
    elif request.param == "memory":
        storage, root = storage_for("memory://x"), f"memory://t-{uuid.uuid4().hex[:20]}/logdir"
        yield storage, root
        storage.remove_tree(root)  # the process's memory: freed
    else:
        storage = request.getfixturevalue("s3_storage")
        yield storage, make_bucket(storage) + "/logdir"


@pytest.fixture
def lifetime_thread_prefixes() -> tuple[str, ...]:
    """The suite's leak check also allows the threads fsspec/asyncio keep for the process
    (fsspec's IO loop, asyncio's resolver executor)."""
    return ("pydevd", "ThreadPoolExecutor-", "Dummy-", "tqdm_monitor", "fsspecIO", "asyncio_")


class FaultProxy:
    """A loopback HTTP proxy in front of the server: answers the first ``fail_first`` requests
    (every request while ``fail_all`` is set) with ``503 SlowDown``, forwards the rest.

    While ``black_hole`` is set it accepts every new connection and then does nothing with it:
    never reads a byte, never answers, never closes it (an endpoint gone silent: a dead load
    balancer target, a firewall dropping packets after the handshake). Those connections stay
    silent when ``black_hole`` is cleared (only new ones are forwarded again) until the proxy
    exits; ``held`` counts them. ``silence_on(command, path)``: the first request it matches is
    read and never answered, and ``black_hole`` is set from then (e.g. mid multipart upload)."""

    def __init__(self, upstream_port: int, fail_first: int = 0, fail_all: bool = False,
                 body_filter: Callable[[str, Any, bytes], bytes] | None = None) -> None:
        """``body_filter(command, headers, body)``: what a forwarded answer's body becomes on the
        wire (its Content-Length still promises the whole body), e.g. a body cut short."""
        self.upstream_port = upstream_port
        self.body_filter = body_filter
        self.fail_first = fail_first
        self.fail_all = fail_all
        self.requests = 0
        self.failed = 0
        self.black_hole = False
        self.silence_on: Callable[[str, str], bool] | None = None
        self.lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._closing = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if proxy._silences(self.command, self.path):
                    proxy._closing.wait()  # read, never answered, never closed while the proxy runs
                    return
                with proxy.lock:
                    proxy.requests += 1
                    fail = proxy.fail_all or proxy.requests <= proxy.fail_first
                    proxy.failed += fail
                if fail:
                    payload = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                               b"<Message>Please reduce your request rate.</Message></Error>")
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    if self.command != "HEAD":  # a HEAD answer has no body (S3's 503 to a HEAD neither)
                        self.wfile.write(payload)
                    return
                self._forward(body)

            def _forward(self, body: bytes) -> None:
                forward(self, proxy.upstream_port, body, proxy.body_filter)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request: Any, client_address: Any) -> None:
                with proxy.lock:
                    if proxy.black_hole:
                        proxy._held.append(request)  # accepted; never read, answered or closed
                        return
                super().process_request(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-fault-proxy", daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def _silences(self, command: str, path: str) -> bool:
        with self.lock:
            if self.silence_on is None or not self.silence_on(command, path):
                return False
            self.silence_on, self.black_hole = None, True
            self._held.append(None)  # type: ignore[arg-type] - counted; its handler thread keeps it open
            return True

    @property
    def held(self) -> int:
        """Connections the black hole accepted (still open, silent)."""
        with self.lock:
            return len(self._held)

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
        with self.lock:
            held, self._held = self._held, []
        for connection in held:
            if connection is not None:
                connection.close()


def assert_copy_holds(copy: Any, data: bytes) -> None:
    """A private copy (`supervisor.checkpoint.load.private_copy.copy_file`) holds exactly ``data``
    (in its file or its buffer) and its CRC-32 is that of ``data``."""
    if copy.path is not None:
        with open(copy.path, "rb") as f:
            assert f.read() == data
    else:
        assert bytes(copy.data) == data
    assert copy.crc == zlib.crc32(data)


def forward(handler: http.server.BaseHTTPRequestHandler, upstream_port: int, body: bytes,
            body_filter: Callable[[str, Any, bytes], bytes] | None = None) -> None:
    """A loopback proxy's forwarding of one request: ``handler``'s request (``body`` already
    read) goes to the server on ``upstream_port``, its answer back, one connection each
    (``body_filter`` as `FaultProxy`'s)."""
    upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("expect", "connection")}
    upstream.request(handler.command, handler.path, body=body, headers=headers)
    response = upstream.getresponse()
    data = response.read()
    handler.send_response(response.status, response.reason)
    for k, v in response.getheaders():
        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
            handler.send_header(k, v)
    # A HEAD answer has no body but the object's length (what stat reports).
    head_length = response.getheader("Content-Length") if handler.command == "HEAD" else None
    handler.send_header("Content-Length", head_length or str(len(data)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    if handler.command != "HEAD":
        handler.wfile.write(data if body_filter is None else body_filter(handler.command, handler.headers, data))
    upstream.close()


def data_url(storage, checkpoint: str, name: str = "state.pt") -> str:
    """The URL of a checkpoint's file ``name``: under the save's data root its manifest names
    (supervisor/checkpoint/layout/fencing.py), beside the manifest in the old layout."""
    import json

    root = json.loads(storage.read_bytes(f"{checkpoint}/MANIFEST.json")).get("root")
    return f"{checkpoint}/{root}/{name}" if root else f"{checkpoint}/{name}"
