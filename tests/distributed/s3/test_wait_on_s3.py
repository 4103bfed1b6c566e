"""Workers waiting for the chief's committed progress on an ``s3://`` logdir (SPEC §12, §16):
`wait_for_global_step` / `committed_step` read the chief's index there with ``storage_options``,
their timeout names the URL; `GlobalStepWaiterHook` in a worker's session waits on it too."""
from __future__ import annotations

import logging
import os
import threading
from types import SimpleNamespace

import pytest

from hooks import GlobalStepWaiterHook, StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.distributed import committed_step, wait_for_global_step
from tests.s3_fixtures import options
from tests.frontdoors.s3.models import build, train_step
from tests.log_handshake import LineSeen

pytestmark = pytest.mark.timeout(120)


def _chief(url: str, opts: dict, last_step: int, hold: threading.Event | None = None) -> None:
    """Trains to ``last_step``; with ``hold``, waits for it at step 2 (before committing step 3)."""
    model, optimizer = build(seed=0)
    with MonitoredTrainingSession(url, model, optimizer, storage_options=opts, save_checkpoint_steps=1,
                                  hooks=[StopAtStepHook(last_step=last_step)], handle_signals=False,
                                  log_step_count_steps=None, save_summaries_steps=None) as s:
        while not s.should_stop():
            if hold is not None and s.global_step == 2:
                assert hold.wait(60), "the worker never started waiting"
            s.run(train_step, model, optimizer)


def test_wait_for_global_step_reads_the_chiefs_index_on_the_url(s3_server, s3_root):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    assert committed_step(url, storage_options=opts) is None
    with pytest.raises(TimeoutError, match=f"to commit step 2 in {url}; the newest committed step is none yet"):
        wait_for_global_step(url, 2, storage_options=opts, timeout_secs=0.3, poll_secs=0.1)
    _chief(url, opts, last_step=2)
    assert committed_step(url, storage_options=opts) == 2
    assert wait_for_global_step(url + "/", 2, storage_options=opts, timeout_secs=10, poll_secs=0.1) == 2
    with pytest.raises(ValueError, match="storage_options=.*local path"):
        wait_for_global_step("runs/local", 2, storage_options=opts)


def test_global_step_waiter_hook_in_a_worker_waits_for_the_chiefs_commits_on_the_url(s3_server, s3_root, caplog):
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    _chief(url, opts, last_step=1)  # the worker restores step 1, then waits for the chief's step 4
    model, optimizer = build(seed=1)
    waiter = GlobalStepWaiterHook(4, poll_secs=0.1, timeout_secs=60, storage_options=opts)
    waiting = threading.Event()  # the handshake: the chief holds at step 2 until the worker waits
    chief = threading.Thread(target=_chief, args=(url, opts, 4, waiting), name="chief")
    handler = LineSeen("waiting for global step", waiting)
    logging.getLogger("hooks.basic").addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="hooks.basic"), \
                MonitoredTrainingSession(url, model, optimizer, is_chief=False, storage_options=opts,
                                         hooks=[waiter], handle_signals=False, max_wait_secs=30) as s:
            assert s.global_step == 1
            chief.start()
            s.run(train_step, model, optimizer)  # returns once the chief committed step 4
            assert waiting.is_set() and committed_step(url, storage_options=opts) == 4
    finally:
        waiting.set()
        logging.getLogger("hooks.basic").removeHandler(handler)
        if chief.ident is not None:
            chief.join(60)
    assert not chief.is_alive()


def test_an_unreadable_index_is_reported_not_silently_waited_on(s3_server, s3_root, monkeypatch, caplog):
    url = s3_root + "/run"
    _chief(url, options(s3_server.endpoint), last_step=1)
    for name in list(os.environ):  # a client with no credentials and no endpoint: every read fails
        if name.startswith(("AWS_", "FSSPEC_S3")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    no_client = {"skip_instance_cache": True}
    assert committed_step(url, storage_options=no_client) is None
    with pytest.raises(OSError, match="credentials"):
        committed_step(url, storage_options=no_client, raise_errors=True)
    with pytest.raises(TimeoutError, match=rf"in {url}; the newest committed step is none yet \(the index cannot be read"):
        wait_for_global_step(url, 1, storage_options=no_client, timeout_secs=0.2, poll_secs=0.1)
    waiter = GlobalStepWaiterHook(5, poll_secs=0.05, timeout_secs=0.3, storage_options=no_client)
    session = SimpleNamespace(logdir=url, global_step=1, stop_requested=False)
    with caplog.at_level(logging.WARNING, logger="hooks.basic"):
        waiter.begin()
        with pytest.raises(TimeoutError, match="for global step 5; the step is 1"):
            waiter.before_run(SimpleNamespace(session=session))
    warnings = [r.getMessage() for r in caplog.records if "cannot read the checkpoint index" in r.getMessage()]
    assert len(warnings) == 1 and url in warnings[0] and "storage_options=" in warnings[0], warnings
