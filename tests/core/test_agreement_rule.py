"""The ranks' agreement rule as a pure function (`supervisor.agreement.combine`): a table of
flags in, a `Decision` out — no process group. And the recovery backoff, likewise pure."""
from __future__ import annotations

import pytest

from supervisor.agreement import NO_REQUESTS, Decision, Requests, combine, flag_count, merge, write_flags
from supervisor.engine.lifecycle import backoff_secs


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


def _summary(world_size, by_rank):
    from supervisor.agreement import SUMMARY_SIZE, write_summary

    reduced = [0] * SUMMARY_SIZE
    for rank, requests in by_rank.items():
        mine = [0] * SUMMARY_SIZE
        write_summary(mine, requests, rank=rank, world_size=world_size)
        reduced = [max(a, b) for a, b in zip(reduced, mine)]  # the all-reduce's MAX
    return reduced


@pytest.mark.parametrize("seed", range(40))
def test_the_fixed_size_summary_decides_as_the_per_rank_flags_do(seed):
    """Issue 31.5: the agreement's own collective sends SUMMARY_SIZE integers whatever the world
    size; every rank reaches the decision the 2 x W flags give (save, stop, preempted, the stop
    named by the lowest requesting rank)."""
    import random

    from supervisor.agreement import combine_summary, summary_of_flags

    rng = random.Random(seed)
    world_size = rng.choice([2, 3, 8, 1000])
    by_rank = {}
    for rank in rng.sample(range(world_size), rng.randint(0, min(4, world_size))):
        by_rank[rank] = Requests(save_reasons=("s",) if rng.random() < 0.5 else (),
                                 stop_reason="x" if rng.random() < 0.5 else None, preempted=rng.random() < 0.3)
    flags = [0] * flag_count(world_size)
    for rank, requests in by_rank.items():
        mine = [0] * flag_count(world_size)
        write_flags(mine, requests, rank=rank, world_size=world_size)
        flags = [max(a, b) for a, b in zip(flags, mine)]
    summary = _summary(world_size, by_rank)
    assert summary_of_flags(flags, world_size=world_size) == summary
    for rank in (0, world_size - 1):
        own = by_rank.get(rank, NO_REQUESTS)
        expected = combine(flags, step=8, started=7, rank=rank, own_reasons=(own.save_reasons, own.stop_reason))
        got = combine_summary(summary, step=8, started=7, rank=rank, world_size=world_size,
                              own_reasons=(own.save_reasons, own.stop_reason))
        assert (got.save, got.stop, got.preempted, got.stop_reason) == \
            (expected.save, expected.stop, expected.preempted, expected.stop_reason)
        assert set(got.save_reasons) <= set(expected.save_reasons) and bool(got.save_reasons) == expected.save
