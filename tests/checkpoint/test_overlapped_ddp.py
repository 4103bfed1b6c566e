"""Overlapped capture under torch.distributed (SPEC §5.9, §12), 2-rank gloo jobs on loopback:
under DDP the chief commits, at each checkpoint step, the state after that step bit for bit;
with sharded (dcp) saves every rank overlaps its own copy, and a write during any rank's copy
discards that save on every rank.

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


def overlapped_dcp(logdir: str, writer_rank: str) -> None:
    import logging
    import threading

    from supervisor import TrainingState, distributed
    from supervisor.checkpoint.sharded import ShardedCheckpointManager, load_into
    from supervisor.checkpoint.save.overlap import ThreadCopier

    gate = threading.Event()

    def held_back(dst, src):
        assert gate.wait(60)
        torch._foreach_copy_(dst, src)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)

    def forward_backward(n):
        optimizer.zero_grad()
        model(torch.randn(8, 6, generator=torch.Generator().manual_seed(n))).pow(2).mean().backward()

    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("supervisor.checkpoint.sharded.manager").addHandler(handler)
    manager = ShardedCheckpointManager(logdir, capture="overlapped", copier=ThreadCopier(held_back))
    manager.open()
    result = {"rank": distributed.rank()}
    for n in (1, 2):
        forward_backward(n)
        optimizer.step()
        after = {k: v.clone() for k, v in model.state_dict().items()}
        gate.clear()
        manager.save(n, state)
        forward_backward(100 + n)  # the next step runs while the copy is held back
        if n == 1 and str(distributed.rank()) == writer_rank:
            model[1].weight.data.clamp_(-1e-3, 1e-3)
        gate.set()
        optimizer.step()
        manager.wait()
        committed = os.path.isdir(os.path.join(logdir, f"model.ckpt-{n}"))
        result[f"committed-{n}"] = committed
        if committed and distributed.rank() == 0:
            fresh = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 2))
            load_into(os.path.join(logdir, f"model.ckpt-{n}"), fresh)
            result[f"equal-{n}"] = all(torch.equal(fresh.state_dict()[k], v) for k, v in after.items())
        torch.distributed.barrier()
    manager.close()
    result["warnings"] = [w for w in warnings if "discarding" in w]
    print("RESULT " + json.dumps(result), flush=True)


@pytest.mark.parametrize("writer_rank", ["none", "1"])
def test_sharded_saves_overlap_per_rank_and_a_write_on_any_rank_discards_everywhere(tmp_path, writer_rank):
    results = harness.run_job("overlapped_dcp", 2, str(tmp_path), writer_rank,
                              module="tests.checkpoint.test_overlapped_ddp")
    assert all(r.returncode == 0 for r in results), harness.describe(results)
    chief, other = results[0].result, results[1].result
    if writer_rank == "none":
        assert chief["committed-1"] and chief["equal-1"], harness.describe(results)
        assert not chief["warnings"] and not other["warnings"]
    else:
        assert not chief["committed-1"] and not other["committed-1"], harness.describe(results)
        for r in (chief, other):
            [warning] = r["warnings"]
            assert "rank 1: model.1.weight" in warning and "capture='blocking'" in warning
    assert chief["committed-2"] and other["committed-2"], harness.describe(results)  # training goes on
    if writer_rank == "none":  # (after rank 1's write the replicas differ: DCP keeps one of them)
        assert chief["equal-2"], harness.describe(results)


def test_ddp_chief_commits_the_state_after_each_checkpoint_step(tmp_path):
    results = harness.run_job("overlapped_ddp", 2, str(tmp_path), module="tests.checkpoint.test_overlapped_ddp")
    assert all(r.returncode == 0 for r in results), harness.describe(results)
    chief = results[0].result
    assert chief["equal"] == {"2": True, "4": True}, harness.describe(results)
    assert chief["moved_on"]


if __name__ == "__main__":
    from tests.distributed import worker

    worker.SCENARIOS["overlapped_ddp"] = overlapped_ddp
    worker.SCENARIOS["overlapped_dcp"] = overlapped_dcp
    sys.exit(worker.main())
