"""Every kind of request to an object store ends within ``storage_options["request_timeout"]``
when the endpoint goes silent (issue 30 item 3): the loopback `tests.s3_fixtures.FaultProxy` in
``black_hole`` mode accepts each connection and then never reads, answers or closes it, in front
of the real moto server, with the real s3fs/botocore client. botocore's own timeouts do not
bound such a request (a ``PutObject`` waited forever for its ``100-continue``; a GET or a LIST
took its read timeout times its attempts): each kind of call here must fail within the bound
with a ``TimeoutError`` naming the operation, the URL and the bound, and the client must work
again once the endpoint answers."""
from __future__ import annotations

import logging
import threading
import time

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint import CheckpointManager  # noqa: E402
from supervisor.checkpoint.ownership.lease import Lease, LeaseLostError  # noqa: E402
from supervisor.checkpoint.storage import storage_for  # noqa: E402
from supervisor.events.object_writer import ObjectEventFile  # noqa: E402
from tests.s3_fixtures import FaultProxy, options  # noqa: E402

pytestmark = pytest.mark.timeout(180)

BOUND = 2.0
#: What a loaded 2-core machine may add to the bound (the thread hop, the cancellation; 6.4 s in
#: all was seen once for a 5 MiB part). The code before the fix: forever, or 32 s.
SLACK = 6.0
MiB = 1 << 20


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.port) as p:
        yield p


@pytest.fixture
def storage(proxy):
    """A client of the moto server through the proxy, bounded by ``BOUND`` seconds a request."""
    return storage_for("s3://x", {**options(proxy.endpoint), "request_timeout": BOUND, "part_size": 5 * MiB})


def _ends_in_time(call, *, operation: str, url: str, kind: type = TimeoutError) -> BaseException:
    """Runs ``call`` on a thread; it must fail within the bound with a ``kind`` error naming
    ``operation``, ``url`` and the bound. Returns the error."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - the outcome under test
            outcome.append(e)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND + 60)
    took = time.monotonic() - started
    assert not thread.is_alive(), f"{operation} on {url} still waits after {took:.0f} s (bound: {BOUND} s)"
    assert outcome, f"{operation} on {url} returned although the endpoint was silent"
    error = outcome[0]
    assert took <= BOUND + SLACK, f"{operation} on {url} ended after {took:.1f} s, past the {BOUND} s bound: {error}"
    message = str(error)
    assert isinstance(error, kind), repr(error)
    assert operation in message and url in message and f"request_timeout={BOUND:g} s" in message, message
    return error


def test_a_put_and_a_create_only_put_end_within_the_bound_then_work_again(proxy, storage, s3_root, s3_storage):
    url = f"{s3_root}/run/MANIFEST.json"
    proxy.black_hole = True
    _ends_in_time(lambda: storage.write_atomic(url, b"x" * 100), operation="put_object", url=url)
    _ends_in_time(lambda: storage.create_exclusive(url, b"{}"), operation="put_object", url=url)
    _ends_in_time(lambda: storage.write_atomic(url, b"x" * (6 * MiB)), operation="put_object", url=url)
    assert proxy.held >= 3
    proxy.black_hole = False  # the silent connections stay silent; new ones are answered
    storage.create_exclusive(url, b"{}")
    assert s3_storage.read_bytes(url) == b"{}"


def test_a_multipart_part_ends_within_the_bound_and_no_clean_up_waits_on_the_silent_store(
        proxy, storage, s3_root, s3_storage, caplog):
    url = f"{s3_root}/run/model.ckpt-1/state.pt"
    writer = storage.open_write(url)
    writer.write(b"a" * (5 * MiB))  # one part: the upload is created and its first part sent
    deadline = time.monotonic() + 60
    while proxy.requests < 2 and time.monotonic() < deadline:  # create + part 1 forwarded
        time.sleep(0.01)
    proxy.black_hole = True
    writer.write(b"b" * MiB)
    try:
        _ends_in_time(writer.sync, operation="upload_part", url=url)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
            writer.close()  # no abort request sent into the silence: left to the next writer
            storage.discard(f"{s3_root}/run/model.ckpt-1")  # neither the failed save's removal
        assert time.monotonic() - started < BOUND, "a clean-up waited on the silent store"
        assert "not aborting the unfinished upload" in caplog.text and "not removing" in caplog.text, caplog.text
    finally:
        proxy.black_hole = False
        writer.close()
    assert not s3_storage.exists(url)  # nothing appears
    assert s3_storage.abort_uploads(f"{s3_root}/run", lambda name: True) == [url]  # the next writer's clean-up


def test_a_direct_part_upload_ends_within_the_bound(proxy, storage, s3_root, s3_storage):
    url = f"{s3_root}/run/big"
    upload = s3_storage.call("create_multipart_upload", url)["UploadId"]
    proxy.black_hole = True
    _ends_in_time(lambda: storage.call("upload_part", url, UploadId=upload, PartNumber=1, Body=b"p" * (5 * MiB)),
                  operation="upload_part", url=url)


def test_reads_end_within_the_bound(proxy, storage, s3_root, s3_storage):
    url = f"{s3_root}/run/state.pt"
    s3_storage.write_atomic(url, b"s" * (3 * MiB))
    etag = s3_storage.stat(url).version
    proxy.black_hole = True
    _ends_in_time(lambda: storage.read_range(url, 0, 100, if_match=etag), operation="get_object", url=url)
    into = bytearray(MiB)
    _ends_in_time(lambda: storage.read_range(url, 0, MiB, into=into, on_piece=lambda _: None),
                  operation="get_object", url=url)
    _ends_in_time(lambda: storage.read_bytes(url), operation="get_object", url=url)
    _ends_in_time(lambda: storage.stat(url), operation="head_object", url=url)
    proxy.black_hole = False
    with storage.open_read(url) as f:
        proxy.black_hole = True
        _ends_in_time(lambda: f.read(10), operation="get_object", url=url)
    proxy.black_hole = False
    assert storage.read_range(url, 0, 4, if_match=etag) == b"ssss"


def test_a_listing_ends_within_the_bound(proxy, storage, s3_root):
    proxy.black_hole = True
    _ends_in_time(lambda: storage.listdir(f"{s3_root}/run"), operation="list_objects_v2", url=f"{s3_root}/run/")
    _ends_in_time(lambda: storage.list_files(f"{s3_root}/run"), operation="list_objects_v2", url=f"{s3_root}/run/")


def test_a_lease_renewal_ends_within_the_bound_and_the_check_then_fails_naming_it(proxy, storage, s3_root, caplog):
    lease = Lease(storage, f"{s3_root}/run", lease_secs=30)
    lease.acquire(renew=False)
    proxy.black_hole = True
    url = f"{s3_root}/run/.supervisor.lease/{2:016d}.json"

    def renew() -> None:
        if not lease.renew():
            raise LeaseLostError(lease.lost)

    with caplog.at_level(logging.ERROR, logger="supervisor.checkpoint.ownership.lease"):
        _ends_in_time(renew, operation="put_object", url=url, kind=LeaseLostError)
    assert "renewing it failed" in lease.lost, lease.lost
    assert any("lease" in r.getMessage() and "is lost" in r.getMessage() for r in caplog.records), caplog.text
    error = _ends_in_time(lease.check, operation="put_object", url=url, kind=LeaseLostError)
    assert "must not commit" in str(error)
    proxy.black_hole = False
    lease.release()


def test_an_events_upload_ends_within_the_bound_and_its_records_are_sent_once_it_answers(proxy, storage, s3_root,
                                                                                         s3_storage):
    logdir = f"{s3_root}/run"
    events = ObjectEventFile(storage, logdir, "", flush_secs=3600, max_queue=10, first=b"version",
                             encode=lambda item: item)
    try:
        events.add(b"record-1")
        proxy.black_hole = True
        error = _ends_in_time(events.flush, operation="put_object", url=f"{logdir}/events.out.tfevents.")
        proxy.black_hole = False
        events.flush()  # the records were kept: sent now
    finally:
        proxy.black_hole = False
        events.close()
    assert "events.out.tfevents." in str(error)
    assert b"record-1" in s3_storage.read_bytes(events.path)


def test_an_unfinished_upload_cleanup_ends_within_the_bound(proxy, storage, s3_root, s3_storage, caplog):
    proxy.black_hole = True
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        assert storage.abort_uploads(f"{s3_root}/run", lambda name: True) == []
    assert time.monotonic() - started <= BOUND + SLACK
    assert "list_multipart_uploads" in caplog.text and f"request_timeout={BOUND:g} s" in caplog.text, caplog.text


@pytest.mark.parametrize("bad", [0, -1, "30", True, float("inf"), float("nan"), None])
def test_a_bad_request_timeout_is_refused_at_construction_naming_the_key(s3_server, s3_root, bad):
    with pytest.raises(ValueError, match=r"storage_options\['request_timeout'\] must be a positive"):
        storage_for("s3://x", {**options(s3_server.endpoint), "request_timeout": bad})
    with pytest.raises(ValueError, match=r"request_timeout"):
        CheckpointManager(f"{s3_root}/run", storage_options={**options(s3_server.endpoint), "request_timeout": bad})
