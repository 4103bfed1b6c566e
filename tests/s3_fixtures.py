"""Fixtures of every object-store test: a real S3-compatible server (moto) on loopback, a fresh
bucket per test, both storage backends, and the fault-injecting loopback proxy (`FaultProxy`: the
benchmarks' `benchmarks._loopback_proxy.LoopbackProxy`, one proxy for both). A test folder uses them
with ``from tests.s3_fixtures import *`` in its conftest.py (see tests/storage/conftest.py).

The real ``s3fs``/``botocore`` client talks to the server over HTTP; nothing is mocked in-process.
"""
from __future__ import annotations

import os
import socket
import uuid
import zlib
from typing import Any, Iterator

import fsspec.asyn
import pytest

from benchmarks._loopback_proxy import LoopbackProxy as FaultProxy, forward  # noqa: F401 - the tests' proxy
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


def assert_copy_holds(copy: Any, data: bytes) -> None:
    """A private copy (`supervisor.checkpoint.load.private_copy.copy_file`) holds exactly ``data``
    (in its file or its buffer) and its CRC-32 is that of ``data``."""
    if copy.path is not None:
        with open(copy.path, "rb") as f:
            assert f.read() == data
    else:
        assert bytes(copy.data) == data
    assert copy.crc == zlib.crc32(data)


def data_url(storage, checkpoint: str, name: str = "state.pt") -> str:
    """The URL of a checkpoint's file ``name``: under the save's data root its manifest names
    (supervisor/checkpoint/layout/fencing.py), beside the manifest in the old layout."""
    import json

    root = json.loads(storage.read_bytes(f"{checkpoint}/MANIFEST.json")).get("root")
    return f"{checkpoint}/{root}/{name}" if root else f"{checkpoint}/{name}"
