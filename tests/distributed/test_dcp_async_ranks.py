"""Asynchronous checkpoint_format="dcp" saves on real gloo groups: the save returns before any
file is written, the committed checkpoint holds the values captured at the save and restores
identically on 2 ranks, 3 ranks and in one process; a failure or a SIGKILLed rank during an
in-flight save never publishes an incomplete checkpoint."""
from __future__ import annotations

import json
import os

import pytest
import torch

from supervisor.checkpoint import latest_checkpoint, verify_checkpoint
from supervisor.checkpoint.sharded import load_into

from .harness import describe, run_job

WORKER = "tests.distributed.dcp_async_worker"


@pytest.mark.slow
def test_an_async_save_on_2_ranks_restores_identically_on_2_3_and_1(tmp_path):
    logdir = str(tmp_path / "run")
    saved = run_job("dcp_async_save", 2, logdir, "dtensor", module=WORKER, timeout=150)
    assert all(r.returncode == 0 for r in saved), describe(saved)
    path = os.path.join(logdir, "model.ckpt-3")
    for r in saved:
        assert r.result["path"] == path and r.result["published_at_return"] is False, r.result
        assert r.result["commits"] == [[3, path]]  # every rank hears of the commit
        # the failing save of step 4 failed on every rank, with rank 1's reason
        assert "step 4" in r.result["failed"] and "No space left on device (injected)" in r.result["failed"]
    manifest = json.loads(open(os.path.join(path, "MANIFEST.json")).read())
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-0.pt", "rng-1.pt"]
    verify_checkpoint(path)
    assert latest_checkpoint(logdir) == path
    assert not [n for n in os.listdir(logdir) if ".tmp-" in n or n == "model.ckpt-4"]
    full = saved[0].result["full"]  # taken before the save; every parameter was +1000 while it wrote
    for size in (2, 3):
        restored = run_job("dcp_restore", size, logdir, "dtensor", timeout=150)
        assert all(r.returncode == 0 for r in restored), describe(restored)
        for r in restored:
            assert (r.result["path"], r.result["step"]) == (path, 3)
            assert r.result["full"] == full, f"rank {r.rank} of {size} restored other values"
        assert [r.result["rng"] for r in restored[:2]] == [s.result["rng"] for s in saved]
    torch.manual_seed(123)
    plain = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 6))
    assert load_into(path, plain) == 3
    assert {k: v.flatten().tolist() for k, v in plain.state_dict().items()} == full


@pytest.mark.slow
def test_a_rank_killed_during_an_async_save_leaves_the_previous_checkpoint_published(tmp_path):
    logdir = str(tmp_path / "run")
    # saves at steps 0, 2, 4, 6 (save_checkpoint_steps=2); rank 1 dies in the save of step 4
    killed = run_job("dcp_async_killed", 2, logdir, "8", "4", module=WORKER, timeout=120, after_rank0_secs=20)
    assert "killing rank 1 during the async save of step 4 (supervisor-dcp-writer, shards written: True)" \
        in killed[1].output, describe(killed)
    assert killed[0].returncode not in (0, None) and killed[1].returncode == -9, describe(killed)
    assert latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-2")
    assert "model.ckpt-4" not in os.listdir(logdir)
    committed = [n for n in os.listdir(logdir) if n.startswith("model.ckpt-") and ".tmp-" not in n]
    assert committed and all(".deleting-" not in n for n in committed)
    for name in committed:
        verify_checkpoint(os.path.join(logdir, name))
    resumed = run_job("dcp_session", 2, logdir, "8", "dtensor", timeout=150)
    assert all(r.returncode == 0 for r in resumed), describe(resumed)
    assert [r.result["start"] for r in resumed] == [2, 2] and [r.result["end"] for r in resumed] == [8, 8]
    assert not any(".tmp-" in n for n in os.listdir(logdir))


@pytest.mark.slow
def test_the_async_benchmark_stays_runnable(capsys):
    from benchmarks.dcp_async import FIGURES, main

    times = main(["--quick"])
    out = capsys.readouterr().out
    for name in (*FIGURES, "stall / sync save"):
        (row,) = [line for line in out.splitlines() if line.strip().startswith(name)]
        assert "(" in row and "-" in row, row
    assert all(len(times[name]) == 2 and all(t > 0 for t in times[name]) for name in FIGURES)


@pytest.mark.slow
def test_a_rank_killed_inside_a_dcp_collective_is_named_by_the_survivor(tmp_path):
    """Issue 21.13: rank 1 dies while the chief is inside ``dcp.save``'s collectives, so the
    chief's DCP fails with gloo's "Connection closed by peer", which names no rank (nor does
    the save's failure, "rank 0: DCP on rank 0: ..."). What the chief raises names rank 1."""
    logdir = str(tmp_path / "run")
    killed = run_job("dcp_async_killed", 2, logdir, "8", "4", "before", module=WORKER, timeout=120,
                     after_rank0_secs=20)
    assert "killing rank 1 before its DCP save of step 4" in killed[1].output, describe(killed)
    chief = killed[0]
    assert chief.returncode not in (0, None) and killed[1].returncode == -9, describe(killed)
    raised = [line for line in chief.output.splitlines() if line.startswith("supervisor.")
              and "Error: " in line]
    assert raised and raised[-1].startswith("supervisor.distributed.failure.RankFailureError: "), describe(killed)
    assert "rank 1 did not respond" in raised[-1] and "heartbeat stopped" in raised[-1], raised[-1]
    assert latest_checkpoint(logdir) == os.path.join(logdir, "model.ckpt-2")
