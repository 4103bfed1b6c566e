"""Scenarios for the agreement carried in DDP's gradient all-reduce (channel.py).

``python -m tests.distributed.channel_worker SCENARIO ...`` (run through harness.run_job with
``module=``); shares worker.py's registry and ``main``.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from supervisor.engine.boundary import NO_REQUESTS, Requests
from tests.distributed.worker import Net, emit, main, scenario, state_digest


def _ddp(seed: int = 0, **kwargs: Any) -> tuple[Any, Any]:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(seed)
    ddp = DistributedDataParallel(Net(), **kwargs)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)


def _train_step(ddp: Any, optimizer: Any, step: int, sync: bool = True) -> None:
    g = torch.Generator().manual_seed(10_000 * dist.get_rank() + step)
    x, y = torch.randn(4, 6, generator=g), torch.randint(0, 2, (4,), generator=g)
    optimizer.zero_grad()
    with contextlib.nullcontext() if sync else ddp.no_sync():
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    optimizer.step()


@scenario
def channel_gradients(steps: str = "6") -> None:
    """The same DDP training with the agreement's channel and without any hook: same weights?"""
    from supervisor.distributed.agreement import CollectiveAgreement

    torch.use_deterministic_algorithms(True)
    with_channel, opt_a = _ddp(bucket_cap_mb=0.0001)  # several buckets: 0 carries the flags
    plain, opt_b = _ddp(bucket_cap_mb=0.0001)
    agreement = CollectiveAgreement(stop_grace_secs=30, modules=[with_channel])
    for step in range(1, int(steps) + 1):
        with torch.random.fork_rng():
            _train_step(with_channel, opt_a, step)
        _train_step(plain, opt_b, step)
        agreement.decide(step, NO_REQUESTS)
    channel = agreement._channel
    agreement.close()
    emit({"with_channel": state_digest(with_channel.module), "plain": state_digest(plain.module),
          "carried": channel.carried if channel else 0, "collectives": agreement.collectives})


@scenario
def channel_requests(no_sync_step: str = "0", own_hook: str = "0") -> None:
    """Rank 1 asks for a save during step 3 and a stop during step 7 while a DDP model trains.
    Step ``no_sync_step`` runs under ``no_sync()`` (no all-reduce); ``own_hook=1`` registers a
    communication hook of the user's before the agreement exists."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from supervisor.distributed.agreement import CollectiveAgreement

    ddp, optimizer = _ddp()
    if own_hook == "1":
        ddp.register_comm_hook(None, allreduce_hook)
    rank = dist.get_rank()
    decisions = []
    for round_ in range(2):  # a second session's agreement on the same model rebinds the channel
        agreement = CollectiveAgreement(stop_grace_secs=30, modules=[ddp])
        for step in range(1, 13):
            _train_step(ddp, optimizer, step, sync=step != int(no_sync_step))
            requests = NO_REQUESTS
            if rank == 1 and step == 3:
                requests = Requests(save_reasons=("timer",))
            if rank == 1 and step == 7:
                requests = Requests(stop_reason="SIGTERM")
            decision = agreement.decide(step, requests)
            if decision.save or decision.stop:
                decisions.append([round_, step, decision.save, decision.stop, decision.stop_reason])
            if decision.stop:
                break
        agreement.close()
    emit({"decisions": decisions, "collectives": agreement.collectives,
          "carried": agreement._channel.carried if agreement._channel else 0,
          "digest": state_digest(ddp.module)})


if __name__ == "__main__":
    main()
