"""A lease renewal stuck on the network never makes the pre-commit `Lease.check` wait past the
lease's own expiry (issue 30 item 3: the renewal held the lease's lock across its request while
`check` waited on the same lock, so a commit waited as long as the network did). `check` decides
from what this writer knows: with more than a third of the lease left by its record it passes at
once; with less, it waits for the renewal in flight at most until the recorded expiry (on the
lease's clock), then fails naming the renewal that is waiting. The storage here is the local one whose requests made on the
renewal's thread wait on a gate — a renewal stuck for as long as the test says (the object
store's silent endpoint is tests/storage/s3/test_black_hole.py)."""
from __future__ import annotations

import threading
import time

import pytest

from supervisor.checkpoint.ownership.lease import Lease, LeaseLostError
from supervisor.checkpoint.storage import LocalStorage
from supervisor.testing import FakeClock

pytestmark = pytest.mark.timeout(60)
LEASE = 30.0
RENEWER = "stuck-renewal"
#: A check that does not wait for the renewal returns in milliseconds; this allows a loaded machine.
PROMPT_SECS = 5.0


class GatedStorage(LocalStorage):
    """Local storage whose ``gated`` operations, made on the renewer's thread, wait for ``gate``."""

    def __init__(self, gated: str) -> None:
        super().__init__()
        self.gated = gated
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _wait(self, operation: str) -> None:
        if operation == self.gated and threading.current_thread().name == RENEWER:
            self.entered.set()
            assert self.gate.wait(60), "the test never opened the gate"

    def create_exclusive(self, path, data):
        self._wait("create_exclusive")
        return super().create_exclusive(path, data)

    def listdir(self, path):
        self._wait("listdir")
        return super().listdir(path)


def _renew_in_background(lease: Lease, storage: GatedStorage) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(lease.renew()), name=RENEWER, daemon=True)
    thread.start()
    assert storage.entered.wait(10), "the renewal never reached the storage"
    return thread, result


def _check_in_background(lease: Lease) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            lease.check()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the outcome under test
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _check_promptly(lease: Lease) -> BaseException | None:
    started = time.monotonic()
    thread, outcome = _check_in_background(lease)
    thread.join(PROMPT_SECS)
    assert not thread.is_alive(), f"check() waited {time.monotonic() - started:.1f} s behind a stuck renewal"
    return outcome[0]


@pytest.mark.parametrize("gated", ["create_exclusive", "listdir"])
def test_a_check_waits_for_a_stuck_renewal_no_longer_than_the_lease_then_fails_naming_it(tmp_path, gated):
    """``create_exclusive``: stuck sending generation n + 1; ``listdir``: n + 1 created, stuck
    listing after it (the check then sees n + 1 and must recognise it as this writer's)."""
    storage, clock = GatedStorage(gated), FakeClock(start_secs=time.time())
    lease = Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock)
    lease.acquire(renew=False)
    clock.advance(LEASE / 3)  # the renewal falls due and goes out
    renewal, renewed = _renew_in_background(lease, storage)
    try:
        assert _check_promptly(lease) is None  # 20 s of 30 left: safe to commit, no wait
        clock.advance(LEASE / 3 + 1)  # 9 s left: the check waits for the renewal, at most 9 s (lease's clock)
        check, outcome = _check_in_background(lease)
        clock.wait_for_waiters(1)
        assert not outcome
        clock.advance(9)  # the lease expired by this writer's record: the renewal is overdue
        check.join(PROMPT_SECS)
        assert not check.is_alive(), "check() kept waiting for a stuck renewal past the lease's expiry"
        error = outcome[0]
        assert isinstance(error, LeaseLostError), error
        message = str(error)
        assert "not renewed in time" in message and "its renewal has waited 20.0 s on the storage" in message, message
        assert "must not commit" in message
    finally:
        storage.gate.set()
        renewal.join(10)
    assert renewed == [False]  # lost for good, even though the renewal went through in the end
    with pytest.raises(LeaseLostError):
        lease.check()


def test_a_renewal_that_comes_back_in_time_keeps_the_lease(tmp_path):
    storage, clock = GatedStorage("create_exclusive"), FakeClock(start_secs=time.time())
    lease = Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock)
    lease.acquire(renew=False)
    clock.advance(LEASE / 3)
    renewal, renewed = _renew_in_background(lease, storage)
    assert _check_promptly(lease) is None
    clock.advance(LEASE / 3 + 1)  # less than a third left: the check waits for the renewal in flight...
    check, outcome = _check_in_background(lease)
    clock.wait_for_waiters(1)
    storage.gate.set()  # ...which comes back before the expiry: the check passes on the renewed record
    renewal.join(10)
    check.join(PROMPT_SECS)
    assert not check.is_alive() and outcome == [None], outcome
    assert renewed == [True]
    clock.advance(5)  # past the first record's expiry, within the renewed one's margin
    assert _check_promptly(lease) is None
    lease.release()


@pytest.mark.parametrize("gated", ["create_exclusive", "listdir"])
def test_a_renewal_that_comes_back_after_the_lease_expired_loses_it_though_no_check_ran_meanwhile(tmp_path, gated):
    """The CI failure of tests/storage/s3/test_outage.py: the store went away while a renewal was
    in flight, its retries outlasted the lease, the store came back and the renewal went through.
    Nothing had called `check` in between, so the renewed record made a writer whose lease had
    expired commit again. A renewal that lands after the expiry of the record it renews came too
    late: the lease is lost, whatever the storage says."""
    storage, clock = GatedStorage(gated), FakeClock(start_secs=time.time())
    lease = Lease(storage, str(tmp_path), lease_secs=LEASE, clock=clock)
    lease.acquire(renew=False)
    clock.advance(LEASE / 3)
    renewal, renewed = _renew_in_background(lease, storage)
    clock.advance(2 * LEASE / 3 + 1)  # the record renewed has expired; no check ran
    storage.gate.set()  # the store is back: the renewal's request goes through
    renewal.join(10)
    assert renewed == [False]
    assert "too late" in (lease.lost or ""), lease.lost
    with pytest.raises(LeaseLostError, match="lost the lease"):
        lease.check()
