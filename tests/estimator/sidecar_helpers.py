"""Helpers of the sidecar / evaluation-loop tests: a clock whose waits run a script of trainer
actions, and a trainer whose weights are a known function of the step."""
from __future__ import annotations

import os
import threading
from typing import Callable

import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.testing import FakeClock


class ScriptedClock(FakeClock):
    """A fake clock whose ``wait`` advances time at once (like ``sleep``), running the actions
    scheduled with `at` when their time comes — a trainer committing checkpoints while an
    evaluator waits, without real sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self._actions: list[tuple[float, int, Callable[[], None]]] = []
        self.waits: list[float] = []

    def at(self, secs_from_now: float, action: Callable[[], None]) -> None:
        self._actions.append((self.time() + secs_from_now, len(self._actions), action))
        self._actions.sort()

    def wait(self, event: threading.Event, timeout_secs: float | None) -> bool:
        if event.is_set():
            return True
        assert timeout_secs is not None, "the loop never waits forever on a scripted clock"
        self.waits.append(timeout_secs)
        target = self.time() + timeout_secs
        while self._actions and self._actions[0][0] <= target:
            when, _, action = self._actions.pop(0)
            self.advance(max(0.0, when - self.time()))
            action()
        self.advance(max(0.0, target - self.time()))
        return event.is_set()

    def sleep(self, secs: float) -> None:
        self.wait(threading.Event(), secs)


def weight_of(step: int) -> float:
    """Every parameter of the trainer's model is filled with this at ``step``."""
    return 0.5 + 0.001 * step


def make_model(width: int = 8) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))


class StepTrainer:
    """Saves checkpoints whose every parameter equals `weight_of(step)` (synchronous saves)."""

    def __init__(self, directory: str, *, max_to_keep: int | None = 5, width: int = 8) -> None:
        self.model = make_model(width)
        self.state = TrainingState({"model": self.model})
        self.manager = CheckpointManager(directory, max_to_keep=max_to_keep, save_mode="sync", save_rng=False)
        self.manager.open()
        self.directory = directory

    def save(self, step: int) -> str:
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(weight_of(step))
        return self.manager.save(step, self.state)

    def close(self) -> None:
        self.manager.close()

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"model.ckpt-{step}")


def weight_metrics(model: torch.nn.Module, batch: object = None) -> dict[str, torch.Tensor]:
    """``w``: the largest parameter value; ``spread``: max - min over every parameter (0 when the
    checkpoint is one consistent step, and then ``w`` is exactly the float32 value every
    parameter holds — a float32 mean over a million parameters would round by ~1e-6)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    top = flat.max()
    return {"w": top, "spread": top - flat.min()}


def float32_weight_of(step: int) -> float:
    """`weight_of` rounded as the trainer's float32 parameters store it."""
    return float(torch.tensor(weight_of(step), dtype=torch.float32))
