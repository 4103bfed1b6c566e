"""The collective agreement on real gloo groups: every rank saves and stops at the same step."""
from __future__ import annotations

import pytest

from .harness import describe, run_job


def test_a_request_on_one_rank_lands_on_every_rank_at_the_next_boundary():
    results = run_job("agreement_requests", 2, timeout=90)
    assert all(r.returncode == 0 for r in results), describe(results)
    decisions = [r.result["decisions"] for r in results]
    assert [d[:3] for d in decisions[0]] == [d[:3] for d in decisions[1]], describe(results)
    # save requested during step 3 (rank 1) -> applied at boundary 4 everywhere; stop at 7 -> 8
    assert [d[:3] for d in decisions[0]] == [[4, True, False], [8, False, True]]
    assert decisions[1][1][3] == "SIGTERM"  # the requester keeps its own reason
    assert decisions[0][1][3] == "stop requested on rank 1 at step 7"
    # a signal's stop (preempted) on rank 1 is a preemption on every rank (issue 21.5)
    assert [d[1][4] for d in decisions] == [True, True] and [d[0][4] for d in decisions] == [False, False]
    # one collective per step, none after the agreed stop
    assert [r.result["collectives"] for r in results] == [7, 7]


def test_a_stop_every_rank_knows_ahead_applies_exactly_at_that_step():
    results = run_job("agreement_last_step", 3, "6", timeout=90)
    assert all(r.returncode == 0 for r in results), describe(results)
    assert [r.result["stopped_at"] for r in results] == [6, 6, 6]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise", "kill", "hang"])
def test_a_failed_rank_stops_the_others_in_bounded_time_naming_it(mode):
    results = run_job("agreement_failure", 2, mode, "4", timeout=60, after_rank0_secs=5)
    survivor = results[0]
    assert survivor.returncode == 0 and survivor.result is not None, describe(results)
    assert survivor.result["ranks"] == [1], describe(results)
    assert "rank 1" in survivor.result["error"]
    if mode == "raise":
        assert "ValueError: boom on rank 1" in survivor.result["error"]
    else:
        assert "did not respond" in survivor.result["error"]
    assert survivor.result["secs_after_failure"] < 4 + 2, survivor.result  # stop_grace_secs + slack


@pytest.mark.slow
def test_a_failure_after_the_agreed_stop_names_the_step_the_ranks_stopped_at():
    """The error of a collective that fails after the ranks agreed to stop at step 4 (a sharded
    session's final save, say) names step 4, not step 0."""
    results = run_job("agreement_failure_after_the_stop", 2, "4", timeout=60, after_rank0_secs=5)
    survivor = results[0]
    assert survivor.returncode == 0 and survivor.result is not None, describe(results)
    assert survivor.result["stopped_at"] == 4
    assert survivor.result["error"] is not None and "rank 1" in survivor.result["error"], survivor.result
    assert survivor.result["step"] == 4 and "stopped at step 4 " in survivor.result["error"], survivor.result
