"""Distributed data-parallel training under torchrun, with checkpoints that resume every rank.

    torchrun --nproc-per-node=2 examples/ddp_torchrun.py                 # gloo on CPU
    torchrun --nproc-per-node=2 --max-restarts=3 examples/ddp_torchrun.py --steps 400

Every rank builds the same model (DDP keeps the replicas equal) and draws its own dropout masks
and batches. Rank 0, the chief, writes the checkpoints and TensorBoard events; the checkpoint
holds every rank's RNG state. Run it again — or let torchrun restart the job after a rank dies —
and every rank restores the checkpoint the chief chose, with its own RNG stream, and carries on
where it stopped: the final weights equal those of an uninterrupted run, bit for bit on CPU.
A stop on any rank (SIGTERM, a NaN loss with ``fail_on_nan_loss=False``, early stopping) ends
every rank at the same step, with a final checkpoint of that step.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Sequence

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hooks import StopAtStepHook  # noqa: E402
from supervisor import MonitoredTrainingSession, distributed  # noqa: E402


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of ``step``: a function of both, so a resumed run sees the same data
    (a real job would checkpoint its loader, e.g. torchdata's StatefulDataLoader)."""
    g = torch.Generator().manual_seed(1_000_003 * rank + step)
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/ddp_torchrun")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--out", default=None, help="rank 0 saves the final weights here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, extra_hooks: Sequence[Any] = ()) -> dict[str, torch.Tensor]:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format=f"[rank {os.environ.get('RANK', '0')}] %(levelname)s %(name)s: %(message)s")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    distributed.init_process_group("gloo", timeout_secs=120)
    try:
        rank = distributed.rank()
        torch.manual_seed(0)  # the same initial weights everywhere
        net = Net()
        # find_unused_parameters=True keeps DDP's bucket layout for the whole run: by default DDP
        # rebuilds its buckets after its first iteration, so a restarted job's first step sums the
        # gradients of 3+ ranks in another order than the uninterrupted run (gloo's ring
        # all-reduce: ~1e-8 differences). With it, restarts are bit-exact on any number of ranks.
        model = DistributedDataParallel(net, find_unused_parameters=True)
        # DDP then prints a C++ warning once per rank, "find_unused_parameters=True was specified
        # ... but did not find any unused parameters": expected here, the flag is for the layout.
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        torch.manual_seed(100 + rank)  # each rank its own dropout stream (checkpointed per rank)

        def train_step(step: int) -> dict[str, torch.Tensor]:
            x, y = batch(rank, step)
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return {"loss": loss.detach()}

        with MonitoredTrainingSession(args.logdir, model=model, optimizer=optimizer,
                                      hooks=[StopAtStepHook(last_step=args.steps), *extra_hooks],
                                      save_checkpoint_steps=args.save_steps, save_checkpoint_secs=None,
                                      log_step_count_steps=50, save_summaries_steps=50,
                                      stop_grace_secs=60, max_wait_secs=300) as session:
            while not session.should_stop():
                output = session.run(train_step, session.global_step)
        logging.info("finished at step %d, loss %.4f (%s)", session.global_step, float(output["loss"]),
                     session.stop_reason)
        weights = {k: v.clone() for k, v in net.state_dict().items()}
        if args.out and rank == 0:
            torch.save(weights, args.out)
    finally:
        distributed.destroy_process_group()
    if session.preempted:  # a SIGTERM on any rank preempts every rank: not finished, resume later
        sys.exit(143)
    return weights


if __name__ == "__main__":
    main()
