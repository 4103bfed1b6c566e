"""Sidecar evaluation: a trainer and an evaluator side by side, as two processes.

The trainer (`MonitoredTrainingSession`) checkpoints every ``--save-steps`` steps and keeps only
the two newest checkpoints; the evaluator (`SidecarEvaluator`) evaluates each new checkpoint on
held-out data, writes ``loss`` and ``accuracy`` to ``LOGDIR/eval`` at the checkpoint's step, and
exits by itself after evaluating the final checkpoint (the trainer marks the run finished).

    python examples/sidecar.py --logdir runs/sidecar                # both roles, two processes
    python examples/sidecar.py train --logdir runs/sidecar          # or each role on its own
    python examples/sidecar.py evaluate --logdir runs/sidecar
    python -m supervisor evaluate runs/sidecar --model examples/sidecar.py:make_model \\
        --data examples/sidecar.py:eval_batches --eval-step examples/sidecar.py:eval_step
    tensorboard --logdir runs/sidecar                               # train and eval curves
"""
from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

import torch
from torch import nn

from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.estimator.sidecar import SidecarEvaluator


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points in the square; the class is the sign of x*y (a model needs a hidden layer)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g) * 2 - 1
    return x, (x[:, 0] * x[:, 1] > 0).long()


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))


def eval_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out set in batches of 256 (another seed than the training data)."""
    x, y = make_data(1024, seed=1)
    return [(x[i:i + 256], y[i:i + 256]) for i in range(0, len(x), 256)]


def eval_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    inputs, labels = batch
    logits = model(inputs)
    return {"loss": nn.functional.cross_entropy(logits, labels),
            "accuracy": (logits.argmax(dim=1) == labels).float().mean()}


def train(logdir: str, steps: int, save_steps: int) -> None:
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y = make_data(4096, seed=0)
    g = torch.Generator().manual_seed(0)

    def train_step() -> dict[str, torch.Tensor]:
        idx = torch.randint(0, len(x), (64,), generator=g)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    with MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, save_checkpoint_steps=save_steps,
                                  max_to_keep=2, hooks=[StopAtStepHook(last_step=steps)]) as s:
        while not s.should_stop():
            s.run(train_step)
    print(f"trainer: stopped at step {s.global_step} ({s.stop_reason})", flush=True)


def evaluate(logdir: str, timeout: float | None) -> None:
    evaluator = SidecarEvaluator(make_model(), eval_batches, logdir, eval_step=eval_step, timeout=timeout,
                                 poll_secs=0.2)
    for result in evaluator.evaluations():
        print(f"evaluator: step {result.step}: loss {result.metrics['loss']:.3f}, "
              f"accuracy {result.metrics['accuracy']:.3f}", flush=True)
    stats = evaluator.stats
    print(f"evaluator: stopped ({evaluator.stop_reason}) after {stats.evaluated} evaluations; "
          f"{stats.vanished} checkpoint(s) were deleted before they could be read", flush=True)


def side_by_side(args: argparse.Namespace) -> int:
    """Starts the evaluator first (it waits for the first checkpoint), then the trainer."""
    me = os.path.abspath(__file__)
    common = ["--logdir", args.logdir]
    evaluator = subprocess.Popen([sys.executable, me, "evaluate", *common, "--timeout", str(args.timeout)])
    trainer = subprocess.Popen([sys.executable, me, "train", *common, "--steps", str(args.steps),
                                "--save-steps", str(args.save_steps)])
    try:
        codes = [trainer.wait(timeout=args.timeout), evaluator.wait(timeout=args.timeout)]
    finally:
        for process in (trainer, evaluator):
            if process.poll() is None:
                process.kill()
                process.wait()
    print(f"trainer exit code {codes[0]}, evaluator exit code {codes[1]}; metrics in {args.logdir}/eval")
    return 0 if codes == [0, 0] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", choices=("both", "train", "evaluate"), default="both")
    parser.add_argument("--logdir", default="runs/sidecar", help="checkpoints + events (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3000, help="train until this global step")
    parser.add_argument("--save-steps", type=int, default=200, help="checkpoint every N steps")
    parser.add_argument("--timeout", type=float, default=600,
                        help="the evaluator gives up after this long without a new checkpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.role == "train":
        train(args.logdir, args.steps, args.save_steps)
    elif args.role == "evaluate":
        evaluate(args.logdir, args.timeout)
    else:
        return side_by_side(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
