"""A second writer refused the logdir leaves nothing in it (issue 30 item 9): no events file, no
events object. Writer 1 is a real training process holding the logdir (a flock locally, a lease on
a real S3-compatible server); writer 2 is a `MonitoredTrainingSession` in this process, refused
with `LogdirInUseError`. The logdir is listed before and after the refusal: nothing new."""
from __future__ import annotations

import json
import os
import time

import pytest
import torch

from supervisor import MonitoredTrainingSession
from supervisor.errors import LogdirInUseError
from supervisor.events import EVENTS_PREFIX
from supervisor.summary import SummaryWriterCache
from tests import zygote
from tests.s3_fixtures import backend_logdir, lifetime_thread_prefixes, s3_server, s3_storage  # noqa: F401

pytestmark = pytest.mark.timeout(120)

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "curve_trainer.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def logdir(backend_logdir):
    """``(storage, logdir, storage_options)`` of each backend (`tests.s3_fixtures.backend_logdir`)."""
    return backend_logdir


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _hold(storage_logdir, tmp_path) -> tuple[zygote.Forked, str]:
    """Writer 1, once its session is created (it holds the logdir); and its release file."""
    _, where, storage_options = storage_logdir
    out, release = str(tmp_path / "writer1.out"), str(tmp_path / "release")
    env = {**os.environ, "RELEASE_FILE": release, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    args = [where, 0, "hold"] + ([json.dumps(storage_options)] if storage_options else [])
    writer = zygote.Forked(TRAINER, args, output=out, env=env)
    deadline = time.monotonic() + 90
    while "holding" not in _read(out):
        assert writer.poll() is None, f"writer 1 died: {_read(out)}"
        assert time.monotonic() < deadline, f"writer 1 never held the logdir: {_read(out)}"
        time.sleep(0.02)
    return writer, release


@pytest.mark.slow  # a training process (the zygote's fork) and a session refused
def test_a_refused_second_writer_leaves_no_events_file_in_the_live_writers_logdir(logdir, tmp_path):
    storage, where, storage_options = logdir
    writer, release = _hold(logdir, tmp_path)
    try:
        before = sorted(storage.listdir(where))
        assert [n for n in before if n.startswith(EVENTS_PREFIX)], before  # writer 1's own events
        model = torch.nn.Linear(4, 1)
        with pytest.raises(LogdirInUseError, match=f"pid {writer.pid}"):
            MonitoredTrainingSession(where, model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     storage_options=storage_options)
        assert sorted(storage.listdir(where)) == before  # writer 2 opened nothing there
    finally:
        open(release, "w").close()
        assert writer.wait(60) == 0, _read(str(tmp_path / "writer1.out"))
        SummaryWriterCache.clear()
    assert "finished 0" in _read(str(tmp_path / "writer1.out"))
