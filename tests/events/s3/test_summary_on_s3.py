"""TensorBoard events on an object store (SPEC §16, issue 24 item 4), against a real moto server
over HTTP with the real s3fs/botocore client.

An object cannot be appended to: the summary writer uploads a new immutable events object every
``flush_secs`` (and at ``flush``/``close``). What users rely on, checked with TensorBoard's own
``EventAccumulator``:

- on the objects downloaded into a local directory: one run, one curve per tag, every point,
  steps in order;
- on the ``s3://`` URL itself, as ``tensorboard --logdir s3://...`` reads it (for any URL but
  ``gs://`` TensorBoard falls back to its Python loader, this one). TensorBoard 2.21's
  ``tensorboard.compat.tensorflow_stub.io.gfile`` serves ``s3://`` with its boto3
  ``S3FileSystem`` when boto3 is installed (it is here: moto needs it), else with its fsspec
  filesystem (s3fs: what the ``[s3]`` extra installs), which also serves chained URLs such as
  ``simplecache::s3://...``. Both read the bucket directly against moto and are tested; both
  find the server through ``AWS_ENDPOINT_URL_S3`` (boto3/botocore read it; TensorBoard's own
  ``S3_ENDPOINT`` is read once, when it is imported).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from supervisor.events import EVENTS_PREFIX, object_writer, read_scalars  # noqa: E402
from supervisor.summary import SummaryWriter, SummaryWriterCache  # noqa: E402
from tests.events.s3.conftest import cached_options as options  # noqa: E402
from tests.s3_fixtures import FaultProxy  # noqa: E402

pytestmark = pytest.mark.timeout(90)

#: The writer's own retries (the next upload sends the kept records), without botocore's in front.
NO_RETRIES = {"mode": "standard", "total_max_attempts": 1}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(autouse=True)
def _clear_cache():
    yield
    SummaryWriterCache.clear()


def events_objects(storage, url):
    return [name for name in storage.listdir(url) if name.startswith(EVENTS_PREFIX)]


def download(storage, url, directory):
    """Every events object under ``url`` into ``directory``; their names."""
    names = events_objects(storage, url)
    for name in names:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(storage.read_bytes(storage.join(url, name)))
    return names


def points(logdir, tag="loss"):
    accumulator = EventAccumulator(str(logdir))
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_new_object_every_flush_secs_and_tensorboard_shows_one_curve(s3_server, s3_storage, s3_root, tmp_path):
    url = s3_root + "/run"
    writer = SummaryWriter(url, flush_secs=0.2, max_queue=3, storage_options=options(s3_server.endpoint))
    assert len(events_objects(s3_storage, url)) == 1  # the version event, at construction
    for batch in range(4):
        uploaded = len(events_objects(s3_storage, url))
        for step in range(batch * 10, batch * 10 + 10):
            writer.add_scalar("loss", 1.0 / (step + 1), step)
        wait_for(lambda: len(events_objects(s3_storage, url)) > uploaded)  # the thread uploaded, unasked
    writer.add_scalar("loss", 0.0, 40)
    writer.close()
    names = download(s3_storage, url, tmp_path)
    assert len(names) >= 6  # version, >= 4 ticks, the close: never appended, always new objects
    # TensorBoard reads the objects in name order, each whole: one curve, every point once, steps
    # in order (so the names sort in upload order).
    assert points(tmp_path) == [(step, pytest.approx(1.0 / (step + 1) if step < 40 else 0.0))
                                for step in range(41)]


@pytest.mark.parametrize("scheme", ["", "simplecache::"], ids=["boto3", "fsspec"])
def test_tensorboard_reads_the_s3_url_directly(s3_server, s3_storage, s3_root, monkeypatch, scheme):
    url = s3_root + "/run"
    with SummaryWriter(url, flush_secs=3600, storage_options=options(s3_server.endpoint)) as writer:
        for step in range(5):
            writer.add_scalar("loss", float(step), step)
        writer.flush()  # a second object
        writer.add_scalar("loss", 5.0, 5)
    assert len(events_objects(s3_storage, url)) == 3
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    assert points(scheme + url) == [(step, float(step)) for step in range(6)]


def test_nothing_is_lost_at_close_and_flush_uploads_only_what_is_new(s3_server, s3_storage, s3_root, tmp_path):
    url = s3_root + "/run"
    writer = SummaryWriter(url, flush_secs=3600, max_queue=2, storage_options=options(s3_server.endpoint))
    writer.add_scalar("loss", 1.0, 1)
    writer.flush()
    writer.flush()  # nothing new: no empty object
    assert len(events_objects(s3_storage, url)) == 2
    for step in range(2, 7):  # past max_queue: encoded by the thread, uploaded at close
        writer.add_scalar("loss", float(step), step)
    # The thread, woken by max_queue, took each full batch off the queue (it encoded at least 1 + 4
    # events: a last one alone stays queued) and its pass is over (the file's I/O lock is free): it
    # did its work, and uploaded nothing (a handshake with the thread, not a sleep).
    events_file = writer._writer
    wait_for(lambda: events_file._encoded >= 5)
    with events_file._io_lock:
        pass
    assert len(events_objects(s3_storage, url)) == 2
    writer.add_session_log("STOP", 6)
    writer.close()
    writer.close()
    assert len(events_objects(s3_storage, url)) == 3
    download(s3_storage, url, tmp_path)
    assert points(tmp_path) == [(step, float(step)) for step in range(1, 7)]


def test_a_failed_upload_keeps_its_records_and_the_next_one_sends_them(s3_server, s3_storage, s3_root, tmp_path,
                                                                       caplog):
    url = s3_root + "/run"
    with FaultProxy(s3_server.port) as proxy:
        writer = SummaryWriter(url, flush_secs=0.3, storage_options=options(proxy.endpoint, retries=NO_RETRIES))
        try:
            proxy.fail_all = True  # 503 SlowDown to every request (botocore's retries are tested in tests/storage)
            with caplog.at_level(logging.WARNING, logger="supervisor.events.object_writer"):
                writer.add_scalar("loss", 1.0, 1)
                wait_for(lambda: "could not upload the events object" in caplog.text)  # the thread's tick
                writer.add_scalar("loss", 2.0, 2)  # the training thread is not disturbed
                with pytest.raises(OSError, match=r"503 SlowDown"):
                    writer.flush()
            proxy.fail_all = False
            writer.add_scalar("loss", 3.0, 3)
            wait_for(lambda: len(events_objects(s3_storage, url)) == 2)  # the next tick sent them all
            writer.add_scalar("loss", 4.0, 4)
        finally:
            proxy.fail_all = False
            writer.close()
    assert len(events_objects(s3_storage, url)) == 3
    download(s3_storage, url, tmp_path)
    assert points(tmp_path) == [(step, float(step)) for step in range(1, 5)]  # each exactly once


def test_close_says_what_is_lost_when_the_store_stays_unreachable(s3_server, s3_root):
    url = s3_root + "/run"
    with FaultProxy(s3_server.port) as proxy:
        writer = SummaryWriter(url, flush_secs=3600, storage_options=options(proxy.endpoint, retries=NO_RETRIES))
        writer.add_scalar("loss", 1.0, 1)
        proxy.fail_all = True
        with pytest.raises(OSError, match=r"the last events of s3://.*/run \(\d+ bytes of records\) could not be "
                                          r"uploaded and are lost: .*503 SlowDown"):
            writer.close()


def test_a_bad_bucket_fails_at_construction_naming_it(s3_server, s3_root):
    with pytest.raises(FileNotFoundError, match=r"s3://no-such-bucket-for-events/run/events\.out\.tfevents\."):
        SummaryWriter("s3://no-such-bucket-for-events/run", storage_options=options(s3_server.endpoint))


def test_the_cache_shares_one_writer_per_url(s3_server, s3_root):
    url = s3_root + "/run"
    writer = SummaryWriterCache.get(url, options(s3_server.endpoint))
    assert SummaryWriterCache.get(url + "/") is writer
    assert writer.logdir == url


def test_add_raises_only_once_too_much_waits_for_a_failing_store(s3_server, s3_root, monkeypatch):
    monkeypatch.setattr(object_writer, "MAX_UNSENT_BYTES", 1000)
    url = s3_root + "/run"
    with FaultProxy(s3_server.port) as proxy:
        writer = SummaryWriter(url, flush_secs=3600, storage_options=options(proxy.endpoint, retries=NO_RETRIES))
        proxy.fail_all = True
        for step in range(100):  # ~40 bytes a record: past the bound
            writer.add_scalar("loss", float(step), step)
        with pytest.raises(OSError):
            writer.flush()
        with pytest.raises(OSError, match=r"uploading events under s3://.*/run has failed and \d+ bytes of records "
                                          r"wait \(more than 1000\): .*503 SlowDown"):
            writer.add_scalar("loss", 100.0, 100)
        proxy.fail_all = False
        writer.close()  # nothing was dropped: all 100 records are uploaded
    assert [step for step in read_scalars(url, options(s3_server.endpoint))] == list(range(100))


@pytest.mark.slow  # a fresh interpreter imports torch
def test_what_was_not_closed_is_uploaded_at_interpreter_exit(s3_server, s3_storage, s3_root, tmp_path):
    url = s3_root + "/run"
    script = ("import sys; from supervisor.summary import SummaryWriter\n"
              f"w = SummaryWriter({url!r}, flush_secs=3600, storage_options={options(s3_server.endpoint)!r})\n"
              "for step in range(3): w.add_scalar('loss', float(step), step)\n")
    env = {**os.environ, "PYTHONPATH": ROOT}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)  # fresh: the interpreter's exit
    download(s3_storage, url, tmp_path)
    assert points(tmp_path) == [(step, float(step)) for step in range(3)]


def test_tensorboard_following_two_writers_of_one_directory_reads_every_point(s3_server, s3_root, monkeypatch):
    """TensorBoard reads a directory's files in name order, each once, never going back: an
    object named before one it already read is never read. Two writers uploading in turns must
    therefore name their objects in upload order (names in whole seconds, tie-broken by writer,
    would not within one second)."""
    url = s3_root + "/run"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    first = SummaryWriter(url, flush_secs=3600, storage_options=options(s3_server.endpoint))
    second = SummaryWriter(url, flush_secs=3600, storage_options=options(s3_server.endpoint))
    accumulator = EventAccumulator(url)
    try:
        for step in range(2):
            for tag, writer in (("a", first), ("b", second)):
                writer.add_scalar(tag, float(step), step)
                writer.flush()
                accumulator.Reload()  # TensorBoard following the run as it is written
    finally:
        first.close()
        second.close()
    accumulator.Reload()
    for tag in ("a", "b"):
        assert [(e.step, e.value) for e in accumulator.Scalars(tag)] == [(0, 0.0), (1, 1.0)]
