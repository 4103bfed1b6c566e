"""A hook a user writes in a few lines: stop when the learning rate decays below a floor.

This is the README's example of a custom hook; keep it short and exemplary.
"""
from __future__ import annotations

import torch

from hooks import Hook, RunContext, RunValues
from supervisor import MonitoredSession
from supervisor.testing import RecordingHook


class StopWhenLearningRateBelow(Hook):
    """Requests a stop once the optimizer's learning rate falls below ``min_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, min_lr: float) -> None:
        self.optimizer, self.min_lr = optimizer, min_lr

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if self.optimizer.param_groups[0]["lr"] < self.min_lr:
            run_context.request_stop()


def test_stops_when_the_learning_rate_drops_below_the_floor():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)

    def train_step(x: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    recorder = RecordingHook()
    with MonitoredSession(hooks=[StopWhenLearningRateBelow(optimizer, min_lr=0.1), recorder]) as session:
        while not session.should_stop():
            session.run(train_step, torch.randn(4, 2))

    # lr after each step: 0.5, 0.25, 0.125, 0.0625 < 0.1 -> the 4th step is the last.
    assert session.global_step == 4
    assert recorder.calls[-1] == "end"  # a clean stop: end hooks ran
