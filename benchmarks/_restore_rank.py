"""One rank of ``benchmarks/scale_restore.py``: ``python benchmarks/_restore_rank.py LOGDIR
LAST_STEP WIDTH FORMAT`` trains a tiny wide model until ``LAST_STEP`` through
``MonitoredTrainingSession`` — ``FORMAT`` ``ddp`` (a replicated ``state.pt`` checkpoint) or
``fsdp2`` (``checkpoint_format="dcp"``) — restoring whatever checkpoint is there first. Run as a
script, so that whichever ``supervisor`` is first on ``PYTHONPATH`` (today's or this one) runs."""
from __future__ import annotations

import json
import sys


def main(logdir: str, last_step: str, width: str, fmt: str) -> None:
    import torch
    import torch.distributed as dist

    import hooks
    from supervisor import MonitoredTrainingSession, distributed

    distributed.init_process_group("gloo", timeout_secs=300)
    w = int(width)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 8))
    if fmt == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        trained, extra = model, {"checkpoint_format": "dcp"}
    else:
        from torch.nn.parallel import DistributedDataParallel

        trained, extra = DistributedDataParallel(model), {}
    optimizer = torch.optim.Adam(trained.parameters(), lr=0.01)

    def step() -> None:
        x = torch.randn(4, w, generator=torch.Generator().manual_seed(dist.get_rank()))
        optimizer.zero_grad()
        trained(x).pow(2).mean().backward()
        optimizer.step()

    with MonitoredTrainingSession(logdir, model=trained, optimizer=optimizer,
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step))], save_checkpoint_steps=1000,
                                  log_step_count_steps=None, save_summaries_steps=None, stop_grace_secs=60,
                                  max_wait_secs=300, **extra) as s:
        start = s.global_step
        while not s.should_stop():
            s.run(step)
    print("RESULT " + json.dumps({"start": start, "end": s.global_step}), flush=True)
    distributed.destroy_process_group(timeout_secs=60)


if __name__ == "__main__":
    main(*sys.argv[1:])
