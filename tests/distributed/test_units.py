"""In-process checks of the distributed pieces (no process group needed)."""
from __future__ import annotations

import random

import pytest
import torch

from supervisor import distributed
from supervisor.distributed import restore as channel
from supervisor.distributed import rng as dist_rng
from supervisor.distributed.failure import describe_failure, diagnose
from supervisor.rng import capture_rng_state
from supervisor.testing import FakeClock


class DictStore:
    """The subset of a c10d store the runtime uses."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.checks = 0

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        return all(k in self.data for k in keys)


def test_a_waiting_rank_polls_at_least_every_second_and_times_out_naming_the_key():
    store, clock = DictStore(), FakeClock()
    start = clock.monotonic()
    with pytest.raises(TimeoutError) as info:
        channel.await_decision("supervisor/restore/0/7", max_wait_secs=5, store=store, clock=clock)
    assert clock.monotonic() - start == pytest.approx(5)
    assert store.checks >= 5 / 1.0  # at least one look per second
    message = str(info.value)
    assert "'supervisor/restore/0/7'" in message and "max_wait_secs=5" in message and "chief" in message


def test_the_decision_round_trips():
    store = DictStore()
    channel.publish_decision("k", channel.RestoreDecision("/x/model.ckpt-4", 4), store=store)
    assert channel.await_decision("k", max_wait_secs=0, store=store) == channel.RestoreDecision("/x/model.ckpt-4", 4)


def test_rank_numbers_in_the_checkpoint_get_their_own_state_back_and_others_a_derived_seed():
    torch.manual_seed(5)
    saved = {0: capture_rng_state()}
    expected = torch.rand(3)
    dist_rng.restore_for_rank(saved, 0, step=10, where="ckpt")
    assert torch.equal(torch.rand(3), expected)
    dist_rng.restore_for_rank(saved, 2, step=10, where="ckpt")  # a rank the checkpoint never had
    first = (torch.rand(3), random.random())
    dist_rng.restore_for_rank(saved, 2, step=10, where="ckpt")
    assert torch.equal(torch.rand(3), first[0]) and random.random() == first[1]  # reproducible
    assert dist_rng.derived_seed(10, 2) != dist_rng.derived_seed(10, 3)
    assert dist_rng.derived_seed(10, 2) != dist_rng.derived_seed(11, 2)


def test_gathered_states_are_used_only_for_their_step():
    own = capture_rng_state()
    assert list(dist_rng.states_for_checkpoint(own)) == [distributed.rank()]
    # The gathered states ride in the Decision of their boundary: there is no stale gather to drop.
    assert sorted(dist_rng.states_for_checkpoint(own, {0: own, 1: own})) == [0, 1]


def test_diagnosis_names_failed_and_silent_ranks():
    store = DictStore()
    store.set("failed/1", "ValueError: boom")
    failed, silent = diagnose(store, 0, 3, grace_secs=0.1)
    assert failed == {1: "ValueError: boom"} and silent == [2]
    text = describe_failure(failed, silent, 0.1)
    assert "rank 1 failed (ValueError: boom)" in text and "rank 2 did not respond" in text


def test_agreement_needs_a_process_group():
    from supervisor.distributed import CollectiveAgreement

    with pytest.raises(RuntimeError, match="init_process_group"):
        CollectiveAgreement()


def test_no_process_group_means_one_process():
    assert not distributed.is_distributed()
    assert distributed.default_is_chief(None) is (distributed.rank() == 0)
    assert distributed.default_is_chief(False) is False


class RecordingWatchdog:
    """A real `HangWatchdog` (thread, real TCPStore) whose exit is recorded instead of ending
    the test process."""

    @staticmethod
    def make(store, rank, grace_secs=1.0):
        from supervisor.distributed.failure import HangWatchdog

        class Recording(HangWatchdog):
            exits: list[str]

            def _exit(self, message: str) -> None:
                self.exits.append(message)
                self._stop.set()

        dog = Recording(store, rank, 2, grace_secs=grace_secs)
        dog.exits = []
        return dog


def _tcp_store():
    import socket

    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)


def _wait_for(condition, secs):
    import time

    deadline = time.monotonic() + secs
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("peer_ends", ["killed", "closed", "alive"])
def test_a_blocked_rank_exits_when_a_peer_at_the_same_step_stops_beating_and_only_then(peer_ends):
    """A rank killed at the same step as this one is not "behind": its missing heartbeat names it
    (the flaky DCP kill test: rank 1's writer killed it within its first second, after its
    training thread had reached rank 0's step, before its watchdog's first interval). A peer that
    closed normally, or is alive and blocked too, is never named."""
    store = _tcp_store()
    zero, one = RecordingWatchdog.make(store, 0), RecordingWatchdog.make(store, 1)
    zero.progress(6)
    one.progress(6)
    zero.start()
    if peer_ends == "killed":
        one._stop.set()  # it dies before its first interval: only start()'s heartbeat was posted
    one.start()
    try:
        assert store.check(["heartbeat/1"])  # posted by start(), before any interval
        if peer_ends == "closed":
            one.close()
        exited = _wait_for(lambda: zero.exits, 6)  # blocked > 1 s, then silence > 1 s
        if peer_ends == "killed":
            assert exited and "rank 1 stopped responding: no heartbeat for more than stop_grace_secs=1 s" \
                in zero.exits[0] and "rank 0 waits at step 6" in zero.exits[0]
        else:
            assert not zero.exits and not one.exits
    finally:
        zero.close()
        one.close()


def test_a_blocked_rank_names_a_hung_peer_behind_it_within_about_stop_grace_secs():
    """Issue 22.10: the peer's own heartbeat says how long it has been at its step, so a rank
    blocked for stop_grace_secs names a peer hung behind it at once — not stop_grace_secs after
    it started looking (2× in all, when gloo's transport timeout could fire first)."""
    import time

    store = _tcp_store()
    zero, one = RecordingWatchdog.make(store, 0, grace_secs=4.0), RecordingWatchdog.make(store, 1, grace_secs=4.0)
    zero.progress(6)
    one.progress(5)  # hung in step 6, behind rank 0's boundary 6
    start = time.monotonic()
    zero.start()
    one.start()
    try:
        assert _wait_for(lambda: zero.exits, 12)
        elapsed = time.monotonic() - start
        assert "rank 1 hung: it has been at step 5" in zero.exits[0], zero.exits
        assert elapsed < 7.0, elapsed  # grace 4 s + one interval (1 s) + slack; 2× grace before
        assert not one.exits  # rank 1 is behind: it names nobody
    finally:
        zero.close()
        one.close()
