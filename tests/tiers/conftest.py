"""The tier tests put the logdir on a local directory or on a real moto S3 server on loopback."""
from __future__ import annotations

import fcntl
import os

import pytest

from tests.s3_fixtures import *  # noqa: F401,F403 - fixtures are found by name

STRAIGHT_LAST = 16


@pytest.fixture(scope="session")
def straight_end_digest(tmp_path_factory) -> str:
    """The end digest (model and optimizer) of an uninterrupted 2-rank sharded tiered run
    (tests/tiers/tier_sharded_worker.py) to step STRAIGHT_LAST: the bit-exact reference of the
    sharded kill and node-loss tests, made once per test run (a file under the run's temporary
    root, locked, shared by pytest-xdist's workers) instead of once per test. Saves and copies
    do not touch the training state: the persist interval a test uses does not change it."""
    from tests.distributed.harness import describe, run_job

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, not the worker's
    with open(root / "straight-sharded.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        cached = root / f"straight-sharded-{STRAIGHT_LAST}.digest"
        if cached.exists():
            return cached.read_text()
        run = root / "straight-sharded"
        straight = run_job("dcp_tiers", 2, str(run / "logdir"), str(run / "local"), str(STRAIGHT_LAST), "4", "no",
                           module="tests.tiers.tier_sharded_worker", timeout=240)
        assert all(r.returncode == 0 for r in straight), describe(straight)
        cached.write_text(straight[0].result["end_digest"])
        return cached.read_text()
