"""Issue 31 on real gloo groups of 4 ranks: the failed rank named exactly, the runtime's store
traffic per rank and step the same at W = 2 and W = 4, ranks of one rendezvous round with different
restart counts in one group. The ranks run benchmarks/_scale_worker.py (the benchmark's own
worker: the figures of benchmarks/scale.py and these tests measure the same thing)."""
from __future__ import annotations

import pytest

from .harness import describe, run_job

WORKER = "benchmarks._scale_worker"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["kill", "stop", "raise"])
def test_every_survivor_names_exactly_the_failed_rank_at_4_ranks(kind):
    """Issue 31.3: rank 2 SIGKILLed, SIGSTOPped or raising; each survivor's RankFailureError names
    rank 2 and no healthy rank (before: survivors posted their own secondary collective errors as
    failures, and the others named them)."""
    for trial in range(2):
        results = run_job("blame", 4, kind, "2", "4", module=WORKER, agent_store=True, timeout=120,
                          after_rank0_secs=30)
        for r in results:
            if r.rank == 2:
                continue
            assert r.result is not None and r.result["named"] == [2], f"trial {trial}\n" + describe(results)
            assert 2 not in r.result.get("secondary", []), describe(results)
            if kind == "raise":
                assert "boom on rank 2" in r.result["error"], describe(results)


def _traffic(world_size: int) -> list[dict]:
    results = run_job("traffic", world_size, "4", "2.2", "20", module=WORKER, agent_store=True, timeout=150)
    assert all(r.returncode == 0 and r.result is not None for r in results), describe(results)
    return [r.result for r in results]


@pytest.mark.slow
def test_store_requests_per_rank_and_step_are_the_same_at_2_and_4_ranks():
    """Issue 31.1: steps longer than a heartbeat interval (2.2 s) — each rank used to read every
    peer's heartbeat about once a step (2 + 2(W-1) requests per step and rank). Counted under the
    runtime's PrefixStore: at most one request per step and rank, the same at W = 2 and 4."""
    per_step = {}
    for world_size in (2, 4):
        results = _traffic(world_size)
        per_step[world_size] = sorted(r["steady_requests"] / r["steps"] for r in results)
        assert all(r["collectives"] == r["steps"] + 1 for r in results), results
    assert max(per_step[2] + per_step[4]) <= 1.0, per_step
    assert max(per_step[4]) == max(per_step[2]), per_step
