"""Overlapped capture under DDP (SPEC §5.9, §12): a 2-rank gloo job on loopback whose chief
commits, at each checkpoint step, the state after that step bit for bit.

This file is also the job's worker module: ``python -m tests.checkpoint.test_overlapped_ddp``
registers its scenario with tests/distributed/worker.py and runs that worker's main.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tests.distributed import harness

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def overlapped_ddp(logdir: str) -> None:
    from hooks import StopAtStepHook
    from supervisor import Hook, MonitoredTrainingSession, distributed, load_checkpoint

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))
    model = torch.nn.parallel.DistributedDataParallel(module)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    after: dict[int, dict[str, torch.Tensor]] = {}

    class Record(Hook):
        def after_run(self, run_context, run_values):
            step = run_context.session.global_step
            after[step] = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def step():
        g = torch.Generator().manual_seed(100 * distributed.rank() + len(after))
        optimizer.zero_grad()
        model(torch.randn(8, 6, generator=g)).pow(2).mean().backward()
        optimizer.step()

    with MonitoredTrainingSession(logdir, model, optimizer, hooks=[StopAtStepHook(last_step=4), Record()],
                                  save_checkpoint_steps=2, save_checkpoint_secs=None, save_summaries_steps=None,
                                  save_summaries_secs=None, log_step_count_steps=None, handle_signals=False,
                                  capture="overlapped") as s:
        while not s.should_stop():
            s.run(step)
    result = {"rank": distributed.rank()}
    if distributed.rank() == 0:
        result["equal"] = {}
        for n in (2, 4):
            saved = load_checkpoint(os.path.join(logdir, f"model.ckpt-{n}"))["model"]
            result["equal"][n] = all(torch.equal(saved[k], v) for k, v in after[n].items())
        result["moved_on"] = not torch.equal(after[4]["0.weight"], after[2]["0.weight"])
    print("RESULT " + json.dumps(result), flush=True)


def test_ddp_chief_commits_the_state_after_each_checkpoint_step(tmp_path):
    results = harness.run_job("overlapped_ddp", 2, str(tmp_path), module="tests.checkpoint.test_overlapped_ddp")
    assert all(r.returncode == 0 for r in results), harness.describe(results)
    chief = results[0].result
    assert chief["equal"] == {"2": True, "4": True}, harness.describe(results)
    assert chief["moved_on"]


if __name__ == "__main__":
    from tests.distributed import worker

    worker.SCENARIOS["overlapped_ddp"] = overlapped_ddp
    sys.exit(worker.main())
