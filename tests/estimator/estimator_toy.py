"""A tiny deterministic classification problem and estimator factory for the estimator tests."""
from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from supervisor.estimator import Estimator, RunConfig

X = torch.randn(96, 4, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] + X[:, 1] > 0).long()


def batches(batch_size: int = 16, *, shuffle: bool = False):
    """One epoch of (x, y) batches; ``shuffle`` draws the order from the global torch RNG."""
    order = torch.randperm(len(X)) if shuffle else torch.arange(len(X))
    for i in range(0, len(X), batch_size):
        idx = order[i:i + batch_size]
        yield X[idx], Y[idx]


def endless(shuffle: bool = True):
    def input_fn():
        while True:
            yield from batches(shuffle=shuffle)
    return input_fn


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))


def eval_step(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
    x, y = batch
    logits = model(x)
    return {"loss": nn.functional.cross_entropy(logits, y),
            "accuracy": (logits.argmax(1) == y).float().mean()}


def make_estimator(model_dir: str | os.PathLike, *, seed: int = 0, lr: float = 0.1, **overrides: Any) -> Estimator:
    model = make_model(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def train_step(batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return {"loss": loss}

    config = overrides.pop("config", None) or RunConfig(os.fspath(model_dir), save_checkpoints_steps=5,
                                                        log_step_count_steps=0, save_summary_steps=0)
    arguments = dict(model=model, optimizer=optimizer, train_step=train_step, eval_step=eval_step, config=config)
    arguments.update(overrides)
    return Estimator(**arguments)


def eval_scalars(eval_dir: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` read back with TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(eval_dir, size_guidance={SCALARS: 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class ShuffledLoader:
    """An endless loader reshuffling each epoch with the global torch RNG; its position is
    checkpointed (put it in ``state=``), so a resumed run continues with the next batch."""

    def __init__(self, batch_size: int = 16) -> None:
        self.batch_size, self.position, self.order = batch_size, 0, torch.randperm(len(X))

    def __iter__(self):
        return self

    def __next__(self):
        if self.position >= len(X):
            self.position, self.order = 0, torch.randperm(len(X))
        idx = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return X[idx], Y[idx]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "order": self.order.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position, self.order = int(state["position"]), state["order"].clone()
