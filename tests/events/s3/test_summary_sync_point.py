"""`SummaryWriter.sync_point` (issue 30 item 7): what a checkpoint's commit calls first, so the
summaries of the steps it holds are durable before it is published. Locally (written and
fsynced) and on a real S3-compatible server (uploaded as a new object); a failed upload is a
WARNING there, never an error (the checkpoint still commits), and the records are kept.
The end-to-end test (SIGKILL right after each commit) is tests/integration/test_curve_points.py."""
from __future__ import annotations

import logging

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.events import read_scalars  # noqa: E402
from supervisor.summary import SummaryWriter  # noqa: E402
from tests.events.s3.test_summary_on_s3 import NO_RETRIES, events_objects, options  # noqa: E402
from tests.s3_fixtures import FaultProxy  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def test_a_local_sync_point_writes_what_was_added_before_it_and_then_costs_nothing(tmp_path):
    with SummaryWriter(tmp_path, flush_secs=3600, max_queue=1000) as writer:
        assert writer.sync_point()() is None  # nothing added: nothing to do
        for step in range(3):
            writer.add_scalar("loss", float(step), step)
        point = writer.sync_point()
        writer.add_scalar("loss", 3.0, 3)  # after the point: not its business (a later flush writes it)
        point()
        assert {0, 1, 2} <= set(read_scalars(str(tmp_path)))  # on disk, the events thread never woke
        [events] = tmp_path.glob("events.out.tfevents.*")
        size = events.stat().st_size
        point()  # already durable: no write
        assert events.stat().st_size == size


def test_an_s3_sync_point_uploads_one_new_object_and_a_failed_upload_is_a_warning(s3_server, s3_storage, s3_root,
                                                                                   caplog):
    url = s3_root + "/run"
    with FaultProxy(s3_server.port) as proxy:
        writer = SummaryWriter(url, flush_secs=3600, storage_options=options(proxy.endpoint, retries=NO_RETRIES))
        try:
            writer.add_scalar("loss", 0.5, 1)
            writer.sync_point()()
            assert len(events_objects(s3_storage, url)) == 2  # the version event's, then the point's
            assert read_scalars(url, storage_options=options(s3_server.endpoint)) == {1: {"loss": 0.5}}
            writer.sync_point()()  # nothing new: no object
            assert len(events_objects(s3_storage, url)) == 2
            writer.add_scalar("loss", 0.25, 2)
            proxy.fail_all = True
            with caplog.at_level(logging.WARNING, logger="supervisor.summary"):
                writer.sync_point()()  # does not raise: the commit it precedes goes on
            assert f"could not make the summaries of {url} durable" in caplog.text
            proxy.fail_all = False
        finally:
            writer.close()  # the kept record is uploaded now
    assert read_scalars(url, storage_options=options(s3_server.endpoint)) == {1: {"loss": 0.5}, 2: {"loss": 0.25}}
