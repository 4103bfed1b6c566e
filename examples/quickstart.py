"""Quickstart: train a small classifier under `Supervisor`; run it twice and it resumes.

It generates its own data (three interleaved spirals, no download), trains an MLP with
periodic background checkpoints and TensorBoard summaries in ``--logdir``, and stops at global
step ``--steps``. Run it again with a larger ``--steps`` and it continues from the newest
checkpoint with the same weights, optimizer state, RNG and data position.

    python examples/quickstart.py                      # trains to step 1500
    python examples/quickstart.py --steps 3000         # resumes at 1500, trains to 3000
    python examples/quickstart.py                      # already at 1500: says how to go on
    tensorboard --logdir runs/quickstart               # loss, accuracy, global_step/sec
    python examples/quickstart.py --logdir s3://bucket/run   # an object store (pip install "torch-supervisor[s3]")

An ``s3://`` logdir is configured the standard way, by the ``AWS_*`` environment
(``AWS_ENDPOINT_URL`` for a local S3-compatible server: see the README, "Logdirs beyond one disk").

``--steps`` is the global step to reach, not a number of steps to add, so rerunning the same
command after a preemption finishes the same run. On SIGTERM (or Ctrl-C) the run stops at the
next step, writes a final checkpoint and exits with 128 + the signal number (143 for SIGTERM,
130 for SIGINT), the shell's convention, so a job scheduler sees that it did not finish and
requeues it; rerunning the command resumes.
"""
from __future__ import annotations

import argparse
import logging
import math
import re
import signal
import sys
from typing import Any

import torch
from torch import nn

from hooks import StopAtStepHook
from supervisor import Supervisor


DEFAULT_LOGDIR = "runs/quickstart"


def make_spirals(n_per_class: int = 512, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three noisy interleaved spirals in 2-D: a small problem a linear model cannot solve."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(classes):
        r = torch.linspace(0.05, 1.0, n_per_class)
        theta = c * 2 * math.pi / classes + 4.0 * r + 0.2 * torch.randn(n_per_class, generator=g)
        xs.append(torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c))
    return torch.cat(xs), torch.cat(ys)


class ShuffledBatches:
    """An endless, reshuffled-every-epoch batch iterator that can be checkpointed.

    Its state (epoch and position) goes into the checkpoint with everything else, so a
    resumed run continues with exactly the batch it would have seen next. torchdata's
    ``StatefulDataLoader`` does the same for real datasets (see the README).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return torch.randperm(len(self.x), generator=g)

    def __iter__(self) -> ShuffledBatches:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.batch_size > len(self.x):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation()
        idx = self._order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return self.x[idx], self.y[idx]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.epoch, self.position = int(sd["epoch"]), int(sd["position"])
        self._order = self._permutation()


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, Any, ShuffledBatches]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000, gamma=0.5)
    x, y = make_spirals(seed=seed)
    return model, optimizer, scheduler, ShuffledBatches(x, y, batch_size=64, seed=seed)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default=DEFAULT_LOGDIR, help="checkpoints + events (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=1500, help="train until this global step")
    parser.add_argument("--save-secs", type=float, default=5.0, help="checkpoint every N seconds")
    # Real runs keep the default 120 s. This run lasts 1-10 s: a point every 0.05 s draws 20-200
    # points per curve. Much shorter intervals add nothing readable; a pause is drawn as a stall
    # (global_step/sec = 0) only after 2 s and ten steps' time without a step, never per tick.
    parser.add_argument("--summary-secs", type=float, default=0.05, help="summaries every N seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    model, optimizer, scheduler, batches = build()
    x_all, y_all = batches.x, batches.y

    def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs, labels = batch
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        return {"loss": loss.detach(), "accuracy": accuracy}

    sv = Supervisor(args.logdir, model=model, optimizer=optimizer,
                    state={"scheduler": scheduler, "data": batches},
                    hooks=[StopAtStepHook(last_step=args.steps)],
                    save_model_secs=args.save_secs, save_summaries_secs=args.summary_secs)
    with sv.managed_session() as s:
        start = s.global_step
        print(start_line(start, args.steps, args.logdir))
        while not s.should_stop():
            out = s.run(train_step, next(batches))
            if s.global_step % 500 == 0:
                print(f"step {s.global_step}: loss {out['loss'].item():.3f}")
        step = s.global_step

    with torch.no_grad():
        accuracy = (model(x_all).argmax(dim=1) == y_all).float().mean().item()
    print(f"stopped at step {step} ({s.stop_reason}); accuracy on all {len(x_all)} points: {accuracy:.3f}")
    print(f"checkpoints, index and TensorBoard events are in {args.logdir}/")
    exit_code = preempted_exit_code(s.stop_reason) if s.preempted else 0
    if exit_code:
        print(f"preempted: exiting with {exit_code} so a job scheduler requeues this job; "
              "rerunning the same command resumes from the final checkpoint")
    return {"start_step": float(start), "step": float(step), "accuracy": accuracy, "exit_code": exit_code}


def start_line(start: int, steps: int, logdir: str) -> str:
    """What this run will do, in one line; at the target already, how to train further."""
    if start >= steps:
        where = "" if logdir == DEFAULT_LOGDIR else f" --logdir {logdir}"
        return (f"{logdir} is already at step {start} (--steps {steps} is the step to reach): nothing to "
                f"train. To train further: python examples/quickstart.py{where} --steps {start + 1500}; to "
                f"start over: delete {logdir} or pass another --logdir")
    return f"{'resuming at' if start else 'starting from'} step {start} in {logdir}; training to step {steps}"


def preempted_exit_code(stop_reason: str | None) -> int:
    """128 + the number of the signal that stopped the run (the shell's convention: 143 for
    SIGTERM, 130 for SIGINT); 143 if the reason does not name one."""
    match = re.search(r"\bSIG[A-Z]+\b", stop_reason or "")
    try:
        return 128 + signal.Signals[match.group(0)].value if match else 128 + signal.SIGTERM.value
    except KeyError:
        return 128 + signal.SIGTERM.value


if __name__ == "__main__":
    sys.exit(main()["exit_code"])
