"""A chief whose restore fails fails every rank with the chief's error (SPEC §12, issue 33).

Under ``env://`` (no torchrun agent) rank 0 hosts the process group's store: a chief that posted
its error and raised at once took the store with it, and the other ranks, polling for the
decision, said they "lost the process group's store" instead of naming the chief's failure.
Real 2-rank gloo jobs (tests/distributed/harness.py): every checkpoint of the logdir damaged, so
the chief's verified restore raises `CheckpointCorruptError`."""
from __future__ import annotations

import os

import pytest

from .harness import describe, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _damage_every_checkpoint(logdir: str) -> list[str]:
    damaged = []
    for name in sorted(os.listdir(logdir)):
        path = os.path.join(logdir, name, "state.pt")
        if name.startswith("model.ckpt-") and os.path.isfile(path):
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                f.write(b"\xde\xad\xbe\xef")  # same size: only the checksum tells
            damaged.append(name)
    return damaged


@pytest.mark.parametrize("agent_store", [False, True], ids=["env-store-on-rank-0", "agent-store"])
def test_a_chief_restore_failure_is_named_on_every_rank(tmp_path, agent_store):
    logdir = str(tmp_path / "run")
    first = run_job("ddp_session", 2, logdir, "3", timeout=180)
    assert all(r.returncode == 0 for r in first), describe(first)
    assert _damage_every_checkpoint(logdir) == ["model.ckpt-0", "model.ckpt-3"]
    results = run_job("ddp_session", 2, logdir, "6", timeout=180, agent_store=agent_store)
    chief, other = results
    assert chief.returncode not in (0, None) and other.returncode not in (0, None), describe(results)
    assert "CheckpointCorruptError: none of the 2 checkpoint(s)" in chief.output, describe(results)
    # the other rank names the chief's error and its rank, not a lost store
    assert "lost the process group's store" not in other.output, describe(results)
    assert "the chief's restore failed with CheckpointCorruptError" in other.output, describe(results)
    assert "on the chief (rank 0)" in other.output and "none of the 2 checkpoint(s)" in other.output
    assert other.elapsed < 120, describe(results)  # at once, not after max_wait_secs
