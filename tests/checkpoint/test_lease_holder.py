"""Who may take over a lease before it expires (issue 30 item 8), with a real writer process
holding a real lease (locally and on a real S3-compatible server).

A holder on this host whose process is gone is taken over at once (test_writer_lease.py). These
are the other cases: a holder that still runs (alive, or SIGSTOPped) is refused with how to take
the logdir over; a pid that now belongs to another process (its start time differs) is gone; a
holder recorded on another machine (another boot id) is waited for until its lease expires, and
the refusal says until when."""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace

import pytest

from supervisor.checkpoint.ownership.lease import Lease, LeaseRecord
from tests.checkpoint.conftest import small_state
from tests.checkpoint.test_writer_lease import (HOST, _dead_holders_record, _expiry, _kill, _refusal,  # noqa: F401
                                                _start_writer, _take_over, where)
from tests.s3_fixtures import lifetime_thread_prefixes, s3_server, s3_storage  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def _plant(where, record: LeaseRecord) -> None:
    """``record`` as the lease's next generation (what another writer's renewal would write)."""
    lease = Lease(where.storage, where.root)
    where.storage.create_exclusive(lease.storage.join(lease.path, f"{record.generation:016d}.json"),
                                   record.to_bytes())


@pytest.mark.slow  # a writer process (a torch import)
def test_a_holder_that_still_runs_on_this_host_is_refused_saying_how_to_take_over(where, tmp_path):
    writer, _ = _start_writer(where, 30.0, str(tmp_path / "signals"))
    try:
        record = Lease(where.storage, where.root).newest()
        assert record.boot_id and record.pid_ns and record.started, record  # what tells it is gone later
        for stopped in (False, True):  # SIGSTOPped (a GC pause, a frozen VM): still running
            if stopped:
                os.kill(writer.pid, signal.SIGSTOP)
            message = _refusal(where, lock="lease")
            assert message is not None and f"pid {writer.pid} on host {HOST}" in message, message
            assert f"it runs on this host: stop it (kill {writer.pid})" in message and "at once" in message
            assert time.time() < _expiry(message) <= time.time() + 30.1
    finally:
        _kill(writer)


@pytest.mark.slow  # a writer process (a torch import)
def test_a_pid_that_now_belongs_to_another_process_is_taken_over_at_once(where, tmp_path, caplog):
    writer, _ = _start_writer(where, 30.0, str(tmp_path / "signals"))
    try:
        record = Lease(where.storage, where.root).newest()
        # The same pid, alive, but started at another time: the holder was another process.
        _plant(where, replace(record, generation=record.generation + 1, started=record.started - 1))
        with caplog.at_level("WARNING", logger="supervisor.checkpoint.ownership.lease"):
            manager, _, refusals = _take_over(where, deadline_secs=10)
        manager.close()
        assert not refusals, refusals
        assert f"pid {writer.pid} on this host ({HOST}) is another process now" in caplog.text
    finally:
        _kill(writer)


@pytest.mark.slow  # a writer process (a torch import) and a lease expiry
def test_a_dead_holder_recorded_on_another_machine_is_waited_for_and_the_refusal_says_until_when(where, tmp_path):
    writer, _ = _start_writer(where, 3.0, str(tmp_path / "signals"))
    writer.send_signal(signal.SIGKILL)
    writer.wait(30)
    last = _dead_holders_record(where, writer)
    # What this host reads from a holder on another machine booted elsewhere: it cannot tell.
    foreign = replace(last, generation=last.generation + 1, boot_id="0" * 8 + last.boot_id[8:])
    _plant(where, foreign)
    manager, opened_at, refusals = _take_over(where, deadline_secs=30)
    try:
        assert foreign.expires_at <= opened_at < foreign.expires_at + 5.0 and refusals
        for refusal in refusals:
            assert f"pid {writer.pid} on host {HOST}" in refusal and "cannot see whether it still runs" in refusal
            assert _expiry(refusal) == pytest.approx(foreign.expires_at, abs=0.1)
            assert f"start this run again at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(foreign.expires_at))}" \
                in refusal
        manager.save(2, small_state())
    finally:
        manager.close()


def test_a_record_of_an_older_writer_without_the_process_fields_is_read_and_never_taken_over_early():
    old = {"generation": 1, "owner_id": "x", "host": HOST, "pid": 2 ** 22 + 1, "acquired_at": time.time(),
           "expires_at": time.time() + 30, "lease_secs": 30}
    record = LeaseRecord.from_bytes(json.dumps(old).encode())
    assert (record.boot_id, record.pid_ns, record.started) == ("", "", None)
    assert record.gone() is None  # no boot id: the expiry decides
    assert replace(record, boot_id="b").gone() is None  # nor a boot id without a PID namespace
