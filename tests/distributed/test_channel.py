"""The agreement's flags ride in DDP's gradient all-reduce: same decisions, no collective of
its own, gradients bit-identical to DDP's (real gloo groups on loopback)."""
from __future__ import annotations

import pytest

from .harness import describe, run_job

WORKER = "tests.distributed.channel_worker"


def test_gradients_are_bit_identical_to_ddp_without_a_hook_on_three_ranks():
    results = run_job("channel_gradients", 3, "6", timeout=90, module=WORKER)
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.result["with_channel"] == r.result["plain"], describe(results)
        assert r.result["carried"] == 6 and r.result["collectives"] == 0, r.result
    assert len({r.result["plain"] for r in results}) == 1  # and every rank holds the same weights


def _decisions(results):
    return [[d[:4] for d in r.result["decisions"]] for r in results]


def test_a_request_on_one_rank_rides_the_gradients_to_every_rank_at_the_next_boundary():
    results = run_job("channel_requests", 2, timeout=90, module=WORKER)
    assert all(r.returncode == 0 for r in results), describe(results)
    first, second = _decisions(results)
    # save requested during step 3 (rank 1) -> boundary 4 everywhere; stop at 7 -> 8; twice
    # (the second session's agreement rebinds the channel the first one installed)
    expected = [[0, 4, True, False], [0, 8, False, True], [1, 4, True, False], [1, 8, False, True]]
    assert first == second == expected, describe(results)
    assert results[1].result["decisions"][1][4] == "SIGTERM"
    assert results[0].result["decisions"][1][4] == "stop requested on rank 1 at step 7"
    assert [r.result["collectives"] for r in results] == [0, 0]  # no collective of its own


def test_a_step_without_the_all_reduce_falls_back_to_a_collective_one_step_later():
    results = run_job("channel_requests", 2, "4", timeout=90, module=WORKER)
    assert all(r.returncode == 0 for r in results), describe(results)
    first, second = _decisions(results)
    # step 4 runs under no_sync(): the save staged at 3 goes in the agreement's own collective,
    # started at boundary 4 and applied at 5, on both ranks
    assert first == second == [[0, 5, True, False], [0, 8, False, True],
                               [1, 5, True, False], [1, 8, False, True]], describe(results)
    assert [r.result["collectives"] for r in results] == [1, 1]


@pytest.mark.parametrize("world_size", [2])
def test_a_model_with_its_own_comm_hook_keeps_it_and_the_agreement_uses_its_own_collective(world_size):
    results = run_job("channel_requests", world_size, "0", "1", timeout=90, module=WORKER)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert _decisions(results)[0] == [[0, 4, True, False], [0, 8, False, True],
                                      [1, 4, True, False], [1, 8, False, True]], describe(results)
    assert [r.result["carried"] for r in results] == [0, 0]
    assert [r.result["collectives"] for r in results] == [7, 7]
