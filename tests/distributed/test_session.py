"""Distributed sessions through the front doors, on real gloo groups: the chief chooses the
checkpoint and every rank restores exactly it; DDP state saved under unwrapped keys."""
from __future__ import annotations

import os
import re

import pytest
import torch

from .harness import describe, run_job

RESTORED = re.compile(r"restored step=(\d+) from (\S+)")


def _restored(output: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in RESTORED.finditer(output)]


@pytest.mark.slow
def test_every_rank_restores_the_checkpoint_the_chief_chose(tmp_path):
    logdir = str(tmp_path / "run")
    first = run_job("ddp_session", 2, logdir, "4", timeout=120)
    assert all(r.returncode == 0 for r in first), describe(first)
    assert [r.result["end"] for r in first] == [4, 4]
    assert first[0].result["digest"] == first[1].result["digest"]  # DDP kept them in sync
    # Only the chief wrote; the model's keys are the unwrapped module's.
    payload = torch.load(os.path.join(logdir, "model.ckpt-4", "state.pt"), weights_only=True)
    assert set(payload["model"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    second = run_job("ddp_session", 2, logdir, "6", timeout=120)
    assert all(r.returncode == 0 for r in second), describe(second)
    chosen = [_restored(r.output) for r in second]
    assert chosen[0] == chosen[1] == [(4, os.path.join(logdir, "model.ckpt-4"))], describe(second)
    assert [r.result["start"] for r in second] == [4, 4]
    assert [r.result["end"] for r in second] == [6, 6]


@pytest.mark.slow
def test_a_worker_gives_up_waiting_for_the_chief_with_a_timeout_naming_it(tmp_path):
    results = run_job("ddp_session", 2, str(tmp_path / "run"), "2", "8", "2", timeout=60)
    worker = results[1]
    assert worker.returncode not in (0, None), describe(results)
    assert "TimeoutError" in worker.output and "chief's restore decision" in worker.output
    assert "max_wait_secs=2" in worker.output and "supervisor/restore/" in worker.output
