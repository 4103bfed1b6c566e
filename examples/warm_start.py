"""Warm start: train a new, slightly different model from a pre-trained checkpoint (`init_fn`).

TF's Supervisor guide, "Pre-trained model scenario": a checkpoint saved while training a
slightly different model must initialise the parts the two models share, and only those. Here:

1. pre-train a classifier (trunk + 3-way head) on three spirals, into ``<workdir>/pretrained``;
2. train a new model (the same trunk, plus a new layer and a 2-way head: "spiral 0 or not")
   in ``<workdir>/finetune``. Its ``init_fn`` calls `supervisor.restore_partial` with
   ``include="trunk.*"``: the trunk's weights come from the pre-trained checkpoint, everything
   else keeps its fresh initialisation, and the report says what was loaded and skipped why.
3. run step 2 again: now ``finetune`` has its own checkpoint, so the session restores it and
   ``init_fn`` is not called (SPEC §4) — a warm start happens once, never over a resume.

    python examples/warm_start.py [--workdir runs/warm_start] [--steps 300]
"""
from __future__ import annotations

import argparse
import logging
import math
import os

import torch
from torch import nn

import supervisor
from hooks import StopAtStepHook


def spirals(n_per_class: int = 300, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(3):
        r = torch.linspace(0.05, 1.0, n_per_class)
        theta = c * 2 * math.pi / 3 + 4.0 * r + 0.2 * torch.randn(n_per_class, generator=g)
        xs.append(torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c))
    return torch.cat(xs), torch.cat(ys)


class Classifier(nn.Module):
    """A trunk shared by both tasks, an optional extra layer and a task-specific head."""

    def __init__(self, classes: int, extra_layer: bool = False) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.adapter = nn.Sequential(nn.Linear(64, 64), nn.ReLU()) if extra_layer else nn.Identity()
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.adapter(self.trunk(x)))


def train(logdir: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
          init_fn=None) -> tuple[int, float]:
    """Trains ``model`` to ``steps`` in ``logdir``; returns (the step it started at, accuracy)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def train_step() -> dict[str, torch.Tensor]:
        idx = torch.randint(0, len(x), (64,), generator=g)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    with supervisor.MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, init_fn=init_fn,
                                             hooks=[StopAtStepHook(last_step=steps)],
                                             save_checkpoint_secs=None, save_checkpoint_steps=max(1, steps // 3),
                                             log_step_count_steps=None, save_summaries_steps=None) as s:
        start = s.global_step
        while not s.should_stop():
            s.run(train_step)
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    return start, accuracy


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="runs/warm_start")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    x, y = spirals()
    pretrained_dir, finetune_dir = (os.path.join(args.workdir, d) for d in ("pretrained", "finetune"))

    torch.manual_seed(0)
    _, accuracy = train(pretrained_dir, Classifier(classes=3), x, y, args.steps)
    print(f"pre-trained 3-way classifier: accuracy {accuracy:.3f}, checkpoint {supervisor.latest_checkpoint(pretrained_dir)}")

    calls = []

    def init_fn(session) -> None:
        # Called only when `finetune` has no checkpoint of its own (SPEC §4).
        checkpoint = supervisor.latest_checkpoint(pretrained_dir)
        model = session.state["model"]
        report = supervisor.restore_partial(checkpoint, model, include="trunk.*")
        calls.append(report)
        print(f"warm start from {checkpoint}: {report}")
        # The reader API reads one variable of the checkpoint without loading the rest.
        same = torch.equal(model.trunk[2].weight, supervisor.load_variable(checkpoint, "model/trunk.2.weight"))
        print(f"trunk.2.weight equals the pre-trained one: {same}")

    binary = (y == 0).long()
    results = {}
    for run in (1, 2):  # the second run resumes: no warm start over its own checkpoint
        torch.manual_seed(run)
        steps = args.steps * run
        start, accuracy = train(finetune_dir, Classifier(classes=2, extra_layer=True), x, binary, steps, init_fn)
        how = "warm-started by init_fn" if start == 0 else f"restored its own checkpoint at step {start}"
        print(f"fine-tune run {run}: {how}; trained to step {steps}, accuracy {accuracy:.3f}")
        results[f"run{run}_start"], results[f"run{run}_accuracy"] = float(start), accuracy
    print(f"init_fn calls: {len(calls)}")
    results["init_fn_calls"] = float(len(calls))
    return results


if __name__ == "__main__":
    main()
