"""``lock="lease"`` on both backends: a second writer refused with the holder named, takeover only
after expiry, renewals on a fake clock, a lost lease stopping its writer, and two processes
racing for an expired lease — exactly one wins."""
from __future__ import annotations

import os
import socket
import time

import pytest

from supervisor.checkpoint.ownership.lease import LEASE_DIR, Lease, LeaseLostError
from supervisor.checkpoint.storage import LocalStorage, storage_for
from supervisor.errors import LogdirInUseError
from supervisor.testing import FakeClock
from tests import forked_io, zygote
from tests.s3_fixtures import FaultProxy, make_bucket, options

pytestmark = pytest.mark.timeout(60)
LEASE = 30.0


def test_a_second_writer_is_refused_with_the_holder_and_the_expiry_named(backend):
    storage, root = backend
    clock = FakeClock(start_secs=time.time())
    first = Lease(storage, root, lease_secs=LEASE, clock=clock)
    first.acquire(renew=False)
    with pytest.raises(LogdirInUseError) as refused:
        Lease(storage, root, lease_secs=LEASE, clock=clock).acquire(renew=False)
    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in message
    assert "expires at" in message and f"t={first.expires_at:.1f}" in message and "in 30 s" in message
    first.check()


def test_takeover_only_after_expiry_and_the_old_holder_knows_it_lost(backend):
    storage, root = backend
    clock = FakeClock(start_secs=time.time())
    old = Lease(storage, root, lease_secs=LEASE, clock=clock)
    old.acquire(renew=False)
    new = Lease(storage, root, lease_secs=LEASE, clock=clock)
    clock.advance(LEASE - 1)
    with pytest.raises(LogdirInUseError, match="in 1 s"):
        new.acquire(renew=False)
    clock.advance(2)
    new.acquire(renew=False)
    new.check()
    assert old.renew() is False
    with pytest.raises(LeaseLostError, match="lost the lease"):
        old.check()


def test_an_overtaken_holder_marks_itself_lost_at_its_next_renewal(backend):
    storage, root = backend
    clock = FakeClock(start_secs=time.time())
    old = Lease(storage, root, lease_secs=LEASE, clock=clock)
    old.acquire(renew=False)
    # A paused holder: another clock, far in the future, sees the lease expired and takes it.
    later = FakeClock(start_secs=clock.time() + 10 * LEASE)
    taker = Lease(storage, root, lease_secs=LEASE, clock=later)
    taker.acquire(renew=False)
    assert old.renew() is False
    assert "another writer took it over" in old.lost and f"pid {os.getpid()}" in old.lost
    with pytest.raises(LeaseLostError):
        old.check()
    taker.check()


def test_renewed_every_third_of_the_lease_by_its_thread_and_released_for_the_next_writer(backend):
    storage, root = backend
    clock = FakeClock(start_secs=time.time())
    holder = Lease(storage, root, lease_secs=LEASE, clock=clock)
    holder.acquire()
    try:
        clock.wait_for_waiters(1)
        for _ in range(6):  # two whole lease periods
            before = holder.expires_at
            clock.advance(LEASE / 3)
            clock.wait_for_waiters(1)
            assert holder.expires_at == pytest.approx(before + LEASE / 3)
            holder.check()
        with pytest.raises(LogdirInUseError):
            Lease(storage, root, lease_secs=LEASE, clock=clock).acquire(renew=False)
        generations = storage.listdir(storage.join(root, LEASE_DIR))
        assert len(generations) == 2  # older generations are deleted, the previous one kept
    finally:
        holder.release()
    successor = Lease(storage, root, lease_secs=LEASE, clock=clock)
    successor.acquire(renew=False)  # at once: no need to wait for the expiry
    successor.check()


def test_the_renewal_thread_keeps_a_short_lease_alive_on_the_real_clock(backend):
    storage, root = backend
    holder = Lease(storage, root, lease_secs=3.0)
    holder.acquire()
    try:
        first = holder.expires_at
        deadline = time.monotonic() + 10
        while holder.expires_at < first + 2.0:  # renewed at least twice (every second)
            assert time.monotonic() < deadline, f"not renewed: {holder.lost}"
            holder.check()
            time.sleep(0.05)
        with pytest.raises(LogdirInUseError):
            Lease(storage, root, lease_secs=3.0).acquire(renew=False)
    finally:
        holder.release()
    assert not holder.held


def test_a_stalled_holder_stops_before_the_lease_can_expire(backend):
    storage, root = backend
    clock = FakeClock(start_secs=time.time())
    holder = Lease(storage, root, lease_secs=LEASE, clock=clock)
    holder.acquire(renew=False)
    clock.advance(LEASE * 2 / 3 - 1)
    holder.check()
    clock.advance(2)  # less than a third of the lease left and no renewal
    with pytest.raises(LeaseLostError, match="not renewed in time"):
        holder.check()


def test_an_unreadable_lease_record_counts_as_held_until_it_is_a_lease_old(tmp_path):
    storage = LocalStorage()
    clock = FakeClock(start_secs=time.time())
    Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock).acquire(renew=False)
    directory = tmp_path / LEASE_DIR
    newest = sorted(os.listdir(directory))[-1]
    (directory / f"{int(newest[:16]) + 1:016d}.json").write_text("{torn")
    with pytest.raises(LogdirInUseError, match="pid -1 on host unknown"):
        Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock).acquire(renew=False)
    clock.advance(LEASE + 1)
    Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock).acquire(renew=False)


class _FailingLocal(LocalStorage):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def create_exclusive(self, path, data):
        if self.fail:
            raise OSError(5, f"{path}: Input/output error")
        return super().create_exclusive(path, data)


def test_a_failed_renewal_marks_the_lease_lost_local(tmp_path):
    storage = _FailingLocal()
    clock = FakeClock(start_secs=time.time())
    holder = Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock)
    holder.acquire(renew=False)
    storage.fail = True
    clock.advance(LEASE / 3)
    assert holder.renew() is False
    assert "renewing it failed" in holder.lost and "Input/output error" in holder.lost
    with pytest.raises(LeaseLostError):
        holder.check()


def test_a_failed_renewal_marks_the_lease_lost_s3(s3_server, s3_storage):
    root = make_bucket(s3_storage) + "/run"
    clock = FakeClock(start_secs=time.time())
    with FaultProxy(s3_server.port) as proxy:
        storage = storage_for("s3://x", options(proxy.endpoint))
        holder = Lease(storage, root, lease_secs=LEASE, clock=clock)
        holder.acquire(renew=False)
        proxy.fail_all = True  # the store answers 503 SlowDown to everything from now on
        clock.advance(LEASE / 3)
        assert holder.renew() is False
    assert "renewing it failed" in holder.lost and "503" in holder.lost
    with pytest.raises(LeaseLostError):
        holder.check()


@pytest.mark.slow
def test_two_processes_racing_for_an_expired_lease_exactly_one_wins(s3_server, s3_storage, tmp_path):
    """One round on a local logdir, one on a bucket, by the same two processes."""
    local = str(tmp_path / "logdir")
    os.makedirs(local)
    rounds = [(LocalStorage(), local, "-"), (s3_storage, make_bucket(s3_storage) + "/run", s3_server.endpoint)]
    for storage, root, _ in rounds:  # a holder that died long ago: its lease expired
        Lease(storage, root, lease_secs=LEASE, clock=FakeClock(start_secs=time.time() - 10 * LEASE)).acquire(renew=False)
    signals = str(tmp_path / "signals")
    os.makedirs(signals)
    arguments = [a for _, root, endpoint in rounds for a in (root, endpoint)]
    racers = [zygote.Forked(os.path.join(os.path.dirname(__file__), "lease_racer.py"), [signals, *arguments],
                            output=str(tmp_path / f"racer-{n}.out"), stderr=str(tmp_path / f"racer-{n}.err"),
                            env={**os.environ, "PYTHONPATH": _pythonpath()}) for n in range(2)]
    try:
        for index in range(len(rounds)):
            deadline = time.monotonic() + 45
            while len([n for n in os.listdir(signals) if n.startswith(f"ready-{index}-")]) < 2:
                assert time.monotonic() < deadline, "the racers did not get ready"
                assert all(p.poll() is None for p in racers), [_output(p) for p in racers]
                time.sleep(0.01)
            open(os.path.join(signals, f"go-{index}"), "w").close()
        for p in racers:
            p.wait(timeout=45)
        outputs = [_output(p) for p in racers]
    finally:
        for p in racers:
            forked_io.finish(p)
    assert all(p.returncode == 0 for p in racers), outputs
    results = [out.splitlines() for out, _ in outputs]
    for index in range(len(rounds)):
        lines = sorted(result[index] for result in results)
        assert lines[1] == "WON", outputs
        assert lines[0].startswith("REFUSED: ") and "is in use by another writer" in lines[0], outputs
        assert "expires at" in lines[0]


def _output(racer: zygote.Forked) -> tuple[str, str]:
    """(stdout, stderr) of a racer, as ``Popen.communicate`` gives them."""
    return forked_io.output(racer), forked_io.output(racer, racer.output[:-len(".out")] + ".err")


def _pythonpath() -> str:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([repo] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
