"""The ranks' agreement rule as a pure function (`supervisor.agreement.combine`): a table of
flags in, a `Decision` out — no process group. And the recovery backoff, likewise pure."""
from __future__ import annotations

import pytest

from supervisor.agreement import NO_REQUESTS, Decision, Requests, combine, flag_count, merge, write_flags
from supervisor.lifecycle import backoff_secs


def _flags(world_size, **by_rank):
    flags = [0] * flag_count(world_size)
    for rank, requests in by_rank.items():
        write_flags(flags, requests, rank=int(rank[1:]), world_size=world_size)
    return flags


NONE = ((), None)


@pytest.mark.parametrize("flags, own, expected", [
    (_flags(2), NONE, Decision(8)),
    (_flags(2, r1=Requests(save_reasons=("best",))), NONE,
     Decision(8, save=True, save_reasons=("save requested on rank 1 at step 7",))),
    (_flags(2, r0=Requests(save_reasons=("mine",))), (("mine",), None),
     Decision(8, save=True, save_reasons=("mine",))),
    (_flags(3, r2=Requests(stop_reason="nan")), NONE,
     Decision(8, stop=True, stop_reason="stop requested on rank 2 at step 7")),
    (_flags(2, r0=Requests(stop_reason="mine"), r1=Requests(stop_reason="theirs")), ((), "mine"),
     Decision(8, stop=True, stop_reason="mine")),
    (_flags(2, r1=Requests(stop_reason="SIGTERM", preempted=True)), NONE,
     Decision(8, stop=True, stop_reason="stop requested on rank 1 at step 7", preempted=True)),
])
def test_combine_turns_every_ranks_flags_into_one_decision(flags, own, expected):
    """Rank 0's view: its own reasons kept as they are, the other ranks' named by rank."""
    assert combine(flags, step=8, started=7, rank=0, own_reasons=own) == expected


def test_a_preempted_stop_outranks_a_plain_one_under_max():
    plain, signal = _flags(2, r0=Requests(stop_reason="x")), _flags(2, r0=Requests(stop_reason="y", preempted=True))
    reduced = [max(a, b) for a, b in zip(plain, signal)]
    assert combine(reduced, step=1, started=0, rank=1).preempted


def test_merge_keeps_both_requests_and_the_gathered_rng_states():
    merged = merge(Decision(3, save=True, save_reasons=("a",), rng_states={0: "s"}),
                   Decision(3, stop=True, stop_reason="b"))
    assert merged == Decision(3, save=True, stop=True, save_reasons=("a",), stop_reason="b", rng_states={0: "s"})
    assert NO_REQUESTS == Requests()


@pytest.mark.parametrize("recoveries, expected", [(1, 1.0), (2, 2.0), (3, 4.0), (7, 60.0), (30, 60.0)])
def test_backoff_doubles_from_the_first_wait_up_to_a_minute(recoveries, expected):
    assert backoff_secs(1.0, recoveries) == expected
