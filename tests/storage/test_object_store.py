"""`ObjectStoreStorage` against a real S3-compatible server (moto, over HTTP, real s3fs/botocore):
the server's conditional writes, parallel multipart uploads, configuration from the environment,
throttling retried with a bound, and a server that goes away mid-upload."""
from __future__ import annotations

import os
import threading
import time
import zlib

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import botocore.session  # noqa: E402 - after the skip
import fsspec.config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402
from supervisor.checkpoint.storage import storage_for  # noqa: E402
from tests.s3_fixtures import FaultProxy, MotoServer, make_bucket, options  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def _status(error: ClientError) -> tuple[int, str]:
    return error.response["ResponseMetadata"]["HTTPStatusCode"], error.response["Error"]["Code"]


def test_the_server_enforces_if_none_match_and_if_match(s3_server, s3_root):
    """The probe, with a plain botocore client: moto 5.2.1 answers 412 to both conditions
    (and 404 to If-Match on a missing key)."""
    bucket = s3_root[len("s3://"):]
    client = botocore.session.get_session().create_client("s3", endpoint_url=s3_server.endpoint,
                                                          region_name="us-east-1")

    def call(method, **kwargs):
        return getattr(client, method)(**kwargs)

    first = call("put_object", Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        call("put_object", Bucket=bucket, Key="k", Body=b"2", IfNoneMatch="*")
    assert _status(refused.value) == (412, "PreconditionFailed")
    second = call("put_object", Bucket=bucket, Key="k", Body=b"3", IfMatch=first["ETag"])
    with pytest.raises(ClientError) as stale:
        call("put_object", Bucket=bucket, Key="k", Body=b"4", IfMatch=first["ETag"])
    assert _status(stale.value) == (412, "PreconditionFailed")
    with pytest.raises(ClientError) as missing:
        call("put_object", Bucket=bucket, Key="nothing", Body=b"5", IfMatch=second["ETag"])
    assert _status(missing.value)[0] == 404
    client.close()


class _CountingStorage(ObjectStoreStorage):
    """Counts the part uploads in flight at once (the requests still go to the server)."""

    def __init__(self, fs, **kwargs) -> None:
        super().__init__(fs, **kwargs)
        self.lock = threading.Lock()
        self.in_flight = 0
        self.most_in_flight = 0
        self.parts = 0

    def call(self, method, path, **kwargs):
        if method != "upload_part":
            return super().call(method, path, **kwargs)
        with self.lock:
            self.in_flight += 1
            self.parts += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return super().call(method, path, **kwargs)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_multipart_upload_in_parallel_round_trips_with_the_crc_computed_while_uploading(s3_storage, s3_root):
    storage = _CountingStorage(s3_storage.fs, part_size=5 << 20, max_concurrency=4)
    data = os.urandom((5 << 20) * 4 + 12345)
    path = storage.join(s3_root, "model.ckpt-1", "state.pt")
    with storage.open_write(path) as writer:
        for start in range(0, len(data), 1 << 20):
            writer.write(memoryview(data)[start:start + (1 << 20)])
        writer.sync()
    assert writer.checksum == f"crc32:{zlib.crc32(data):08x}" and writer.nbytes == len(data)
    assert storage.parts == 5 and storage.most_in_flight >= 2
    info = storage.stat(path)
    assert info.size == len(data) and info.version.endswith('-5"')  # a multipart object of 5 parts
    assert storage.read_bytes(path) == data
    assert storage.read_range(path, (5 << 20) - 10, 20) == data[(5 << 20) - 10:(5 << 20) + 10]


def test_an_upload_closed_without_sync_leaves_nothing(s3_storage, s3_root):
    storage = ObjectStoreStorage(s3_storage.fs, part_size=5 << 20, max_concurrency=2)
    path = storage.join(s3_root, "state.pt")
    with storage.open_write(path) as writer:
        writer.write(os.urandom(11 << 20))
    assert not storage.exists(path)
    uploads = storage.fs.call_s3("list_multipart_uploads", Bucket=s3_root[len("s3://"):])
    assert not uploads.get("Uploads")


def test_configured_from_the_aws_environment(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    storage = storage_for("s3://anything", {"skip_instance_cache": True})
    root = make_bucket(storage)
    storage.write_atomic(storage.join(root, "x"), b"via AWS_ENDPOINT_URL_S3")
    assert storage.read_bytes(storage.join(root, "x")) == b"via AWS_ENDPOINT_URL_S3"


def test_configured_from_fsspec_configuration(s3_server, monkeypatch):
    """``FSSPEC_S3_ENDPOINT_URL`` ends up in ``fsspec.config.conf["s3"]`` (read at import)."""
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_server.endpoint})
    storage = storage_for("s3://anything", {"skip_instance_cache": True})
    root = make_bucket(storage)
    assert storage.listdir(root) == []


def test_throttling_is_retried_and_succeeds(s3_server, s3_storage, s3_root):
    with FaultProxy(s3_server.port, fail_first=2) as proxy:
        storage = storage_for("s3://x", options(proxy.endpoint))
        info = storage.write_atomic(storage.join(s3_root, "checkpoint"), b"index")
    assert (proxy.failed, proxy.requests) == (2, 3)
    assert s3_storage.read_versioned(storage.join(s3_root, "checkpoint"))[1].version == info.version


def test_throttling_that_never_stops_fails_after_the_bounded_attempts(s3_server, s3_root):
    with FaultProxy(s3_server.port, fail_all=True) as proxy:
        storage = storage_for("s3://x", options(proxy.endpoint))
        start = time.monotonic()
        with pytest.raises(OSError, match=r"put_object answered 503 SlowDown"):
            storage.write_atomic(storage.join(s3_root, "checkpoint"), b"index")
    assert proxy.requests == 3  # total_max_attempts of the test configuration, never more
    assert time.monotonic() - start < 15


@pytest.mark.slow
def test_the_server_going_away_mid_upload_is_a_clean_error_not_a_hang(s3_server):
    server = MotoServer().start()
    try:
        storage = ObjectStoreStorage(storage_for("s3://x", options(server.endpoint)).fs, part_size=5 << 20,
                                     max_concurrency=2)
        root = make_bucket(storage)
        writer = storage.open_write(storage.join(root, "state.pt"))
        writer.write(os.urandom(10 << 20))  # two parts on their way
        server.stop()
        start = time.monotonic()
        with pytest.raises(OSError) as failed:
            writer.write(os.urandom(10 << 20))
            writer.sync()
        writer.close()
        assert time.monotonic() - start < 60
        assert "state.pt" in str(failed.value)
    finally:
        server.stop()


def test_the_endpoint_in_the_environment_counts_when_the_storage_is_made(monkeypatch):
    """A client made before ``AWS_ENDPOINT_URL_S3`` was set is not reused after (fsspec caches
    clients by their arguments; the endpoint is passed explicitly so the cache key follows it)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    before = storage_for("s3://bucket/run")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    after = storage_for("s3://bucket/run")
    assert after.fs is not before.fs
    assert after.fs.client_kwargs.get("endpoint_url", after.fs.endpoint_url) == "http://127.0.0.1:9"
