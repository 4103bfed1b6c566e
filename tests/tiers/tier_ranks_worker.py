"""Ranks of the two-rank tier tests: ``python -m tests.tiers.tier_ranks_worker tiers LOGDIR LOCAL
LAST_STEP CRASH``, registering into tests/distributed/worker.py's scenarios. A replicated (DDP)
model saved every step to the chief's local tier (``LOCAL/node<rank>``), persisted every 100
steps; ``CRASH=yes`` ends every rank with ``os._exit`` right after the last local commit, as a
crash before the final copy does (the logdir keeps its older step)."""
from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from tests.distributed.worker import emit, main, scenario


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@scenario
def tiers(logdir: str, local: str, last_step: str, crash: str) -> None:
    import hooks
    from supervisor import MonitoredTrainingSession
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    trained = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(trained.parameters(), lr=0.01)

    def step(global_step: int) -> None:
        g = torch.Generator().manual_seed(1000 * dist.get_rank() + global_step)
        optimizer.zero_grad()
        trained(torch.randn(4, 64, generator=g)).pow(2).mean().backward()
        optimizer.step()
    with MonitoredTrainingSession(logdir, model=trained, optimizer=optimizer, local_dir=f"{local}/node{dist.get_rank()}",
                                  persist_every_steps=100, save_checkpoint_steps=1,
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step))], log_step_count_steps=None,
                                  save_summaries_steps=None, stop_grace_secs=30, max_wait_secs=120) as s:
        start, digest = s.global_step, _digest(model)
        while not s.should_stop():
            s.run(step, s.global_step)
        if crash == "yes":
            if s.checkpoint_manager is not None:
                s.checkpoint_manager.wait()  # the last step's local commit
            dist.barrier()
            emit({"start": start, "digest": digest, "end": s.global_step, "end_digest": _digest(model)})
            os._exit(0)
    emit({"start": start, "digest": digest, "end": s.global_step, "end_digest": _digest(model)})


if __name__ == "__main__":
    main()
