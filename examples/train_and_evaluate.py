"""Train and evaluate with TF's Estimator workflow: evaluation after each checkpoint, the best
model exported, early stopping on the evaluation loss.

It generates two noisy interleaved half-moons (no download), trains an MLP with
`supervisor.estimator.train_and_evaluate`, evaluates every committed checkpoint on a held-out
set (on a copy of the model: training is not disturbed), exports the best one so far
(`BestExporter`: weights + a `torch.export` program) and stops early once the evaluation loss
has not decreased for ``--patience`` steps.

    python examples/train_and_evaluate.py                       # trains up to step 3000
    tensorboard --logdir runs/train_and_evaluate                # train curves + eval/ curves
"""
from __future__ import annotations

import argparse
import logging
import math
import os
from typing import Any

import torch
from torch import nn

from hooks import stop_if_no_decrease_hook
from supervisor.estimator import BestExporter, Estimator, EvalSpec, RunConfig, TrainSpec, train_and_evaluate


def make_moons(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points of two interleaved half-moons with Gaussian noise, labels 0/1."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * math.pi
    label = torch.randint(0, 2, (n,), generator=g)
    x = torch.where(label == 0, torch.cos(t), 1 - torch.cos(t))
    y = torch.where(label == 0, torch.sin(t), 0.5 - torch.sin(t))
    points = torch.stack([x, y], dim=1) + 0.15 * torch.randn(n, 2, generator=g)
    return points, label


def build(args: argparse.Namespace) -> tuple[Estimator, Any, Any, tuple[torch.Tensor, torch.Tensor]]:
    """The estimator, the train and eval input functions, and the held-out set."""
    torch.manual_seed(0)
    train_x, train_y = make_moons(2048, seed=1)
    eval_x, eval_y = make_moons(512, seed=2)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    def train_input_fn():  # endless shuffled batches; max_steps or early stopping ends training
        while True:
            order = torch.randperm(len(train_x))
            for i in range(0, len(order) - 63, 64):
                yield train_x[order[i:i + 64]], train_y[order[i:i + 64]]

    def eval_input_fn():  # one pass over the held-out set
        for i in range(0, len(eval_x), 128):
            yield eval_x[i:i + 128], eval_y[i:i + 128]

    def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    def eval_step(eval_model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch  # eval_model is a copy loaded from the checkpoint, in eval mode, under no_grad
        logits = eval_model(x)
        return {"loss": nn.functional.cross_entropy(logits, y), "accuracy": (logits.argmax(1) == y).float().mean()}

    config = RunConfig(args.model_dir, save_checkpoints_steps=args.eval_every, keep_checkpoint_max=3,
                       log_step_count_steps=args.eval_every, save_summary_steps=args.eval_every)
    estimator = Estimator(model=model, optimizer=optimizer, train_step=train_step, eval_step=eval_step,
                          example_input=eval_x[:4], config=config)
    return estimator, train_input_fn, eval_input_fn, (eval_x, eval_y)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="runs/train_and_evaluate")
    parser.add_argument("--steps", type=int, default=3000, help="max_steps of training")
    parser.add_argument("--eval-every", type=int, default=100, help="checkpoint (and evaluate) every N steps")
    parser.add_argument("--patience", type=int, default=500, help="stop after N steps without a lower eval loss")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    estimator, train_input_fn, eval_input_fn, (eval_x, eval_y) = build(args)
    early_stop = stop_if_no_decrease_hook(estimator, "loss", max_steps_without_decrease=args.patience,
                                          run_every_secs=None, run_every_steps=args.eval_every)
    metrics, (best_export,) = train_and_evaluate(
        estimator, TrainSpec(train_input_fn, max_steps=args.steps, hooks=[early_stop]),
        EvalSpec(eval_input_fn, steps=None, exporters=[BestExporter(exports_to_keep=2)], throttle_secs=0))

    print(f"final evaluation at step {metrics['global_step']}: loss {metrics['loss']:.3f}, "
          f"accuracy {metrics['accuracy']:.3f}")
    exports = sorted(os.listdir(os.path.join(args.model_dir, "export", "best_exporter")))
    newest = os.path.join(args.model_dir, "export", "best_exporter", exports[-1])
    program = torch.export.load(os.path.join(newest, "model.pt2"))  # runs without the model's class
    accuracy = (program.module()(eval_x).argmax(1) == eval_y).float().mean().item()
    print(f"best export {newest}: held-out accuracy {accuracy:.3f}")
    return {"metrics": metrics, "best_export": newest, "best_export_accuracy": accuracy,
            "stopped_early": metrics["global_step"] < args.steps}


if __name__ == "__main__":
    main()
