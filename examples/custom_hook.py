"""A hook you write yourself: stop training once the learning rate decays below a floor.

A hook subclasses `supervisor.Hook` and overrides only what it needs; methods it leaves alone
are never called, so it costs nothing on those paths.

    python examples/custom_hook.py
"""
from __future__ import annotations

import torch

import supervisor


class StopAtLowLearningRate(supervisor.Hook):
    """Requests a stop when the optimizer's learning rate drops below ``min_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, min_lr: float) -> None:
        self.optimizer, self.min_lr = optimizer, min_lr

    def after_run(self, run_context, run_values):
        if self.optimizer.param_groups[0]["lr"] < self.min_lr:
            run_context.request_stop()


def main(argv: list[str] | None = None) -> int:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    x, y = torch.randn(64, 4), torch.randn(64, 1)

    def train_step():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        return {"loss": loss.detach()}

    hook = StopAtLowLearningRate(optimizer, min_lr=0.01)
    with supervisor.Supervisor(None, model=model, optimizer=optimizer, hooks=[hook]).managed_session() as s:
        while not s.should_stop():
            s.run(train_step)
    lr = optimizer.param_groups[0]["lr"]
    print(f"stopped at step {s.global_step}: learning rate {lr:.4f} < 0.01")
    return s.global_step


if __name__ == "__main__":
    main()
