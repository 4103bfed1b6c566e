"""Stall of a periodic save with `train_and_evaluate`'s evaluation listener attached vs without it.

SPEC §10.2 / §3.5: the local evaluation listener must not make saves synchronous. The training
loop times every ``run()``; the stall of a save is the duration of the step whose boundary
captures it minus the median duration of a plain step. Variants, run in interleaved rounds:

Each step lasts ``--step-ms`` (a sleep standing for the step's compute), so a save's background
write overlaps the following steps as in real training.

- ``no listener``: `CheckpointSaverHook` alone;
- ``evaluation listener``: the same hook with `EvaluateAfterSaveListener` (throttle 0: every
  committed checkpoint is evaluated, on a copy of the model, at a later step boundary);
- ``synchronous save`` (for scale): the hook's save followed by waiting for the commit, what a
  listener used to cost before commits were delivered at later boundaries.

Reports medians over rounds with min–max. The machines are shared: figures are noisy.

    python -m benchmarks.eval_listener_stall            # 64 MiB state, 5 rounds
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

import hooks
from supervisor import Hook, MonitoredTrainingSession
from supervisor.estimator import Estimator, EvalSpec, RunConfig
from supervisor.estimator.training import EvaluateAfterSaveListener, Evaluator

VARIANTS = ("no listener", "evaluation listener", "synchronous save")


class _WaitForCommit(Hook):
    """Makes each scheduled save synchronous: waits for the commit right after the capture."""

    def __init__(self) -> None:
        self.manager: Any = None

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.manager = session.checkpoint_manager

    def before_run(self, run_context: Any) -> None:
        self.manager.wait()  # the previous step's capture: its write is waited for inside a step


def _model(mib: float) -> nn.Module:
    width = max(8, int((mib * 2**20 / 4 / 4) ** 0.5))  # 4 square layers of float32
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(4)])


def _session_step_times(directory: str, model: nn.Module, variant: str, steps: int, every: int,
                        step_secs: float) -> list[float]:
    estimator = Estimator(model=model, eval_step=lambda m, b: {"loss": m[0].weight[0, :4].sum()},
                          config=RunConfig(directory, save_checkpoints_steps=every, keep_checkpoint_max=2))
    listeners = []
    if variant == "evaluation listener":
        evaluator = Evaluator(estimator, EvalSpec(lambda: [0], steps=1, throttle_secs=0), None)
        listeners.append(EvaluateAfterSaveListener(evaluator, 0, start_step=0, clock=estimator.clock))
    extra = [_WaitForCommit()] if variant == "synchronous save" else []
    saver = hooks.CheckpointSaverHook(directory, save_steps=every, listeners=listeners)
    x = torch.zeros(4)

    def step() -> torch.Tensor:  # a training step of step_secs: the write of a save overlaps the next steps
        time.sleep(step_secs)
        return x.add_(1)

    times = []
    with MonitoredTrainingSession(directory, model, chief_only_hooks=[saver], hooks=extra,
                                  save_checkpoint_secs=None, save_checkpoint_steps=None,
                                  save_summaries_steps=None, save_summaries_secs=None,
                                  log_step_count_steps=None, max_to_keep=2, handle_signals=False) as session:
        session.checkpoint_manager.wait()  # the creation save is not part of the periodic stall
        for _ in range(steps):
            start = time.perf_counter()
            session.run(step)
            times.append(time.perf_counter() - start)
    return times


def _stall(times: list[float], every: int, variant: str) -> float:
    # step i (0-based) ends at global step i + 1; its boundary captures when (i + 1) % every == 0.
    # A synchronous save is waited for at the start of the next step.
    offset = 1 if variant == "synchronous save" else 0
    save_steps = [t for i, t in enumerate(times) if (i + 1 - offset) % every == 0 and i >= offset]
    plain = [t for i, t in enumerate(times) if (i + 1) % every not in (0, 1)]
    return statistics.median(save_steps) - statistics.median(plain)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--every", type=int, default=10, help="save every N steps")
    parser.add_argument("--saves", type=int, default=4, help="periodic saves per session")
    parser.add_argument("--step-ms", type=float, default=30, help="duration of a training step")
    parser.add_argument("--quick", action="store_true", help="tiny state, 2 rounds (for the test suite)")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.rounds, args.saves, args.step_ms = 2, 2, 2, 5
    model = _model(args.mib)
    stalls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    root = tempfile.mkdtemp(prefix="eval_listener_stall-")
    try:
        for round_ in range(args.rounds):
            for variant in VARIANTS:
                directory = os.path.join(root, f"{round_}-{variant.replace(' ', '_')}")
                times = _session_step_times(directory, model, variant, args.every * args.saves, args.every,
                                            args.step_ms / 1e3)
                stalls[variant].append(_stall(times, args.every, variant))
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _print(stalls, args)
    return stalls


def _print(stalls: dict[str, list[float]], args: Any) -> None:
    base = statistics.median(stalls["no listener"])
    print(f"stall of a periodic save, {args.mib:g} MiB state, save every {args.every} steps of "
          f"{args.step_ms:g} ms, "
          f"{args.rounds} rounds (medians, min-max; shared machine: noisy)")
    for variant in VARIANTS:
        values = stalls[variant]
        median = statistics.median(values)
        ratio = median / base if base > 0 else float("nan")
        print(f"  {variant:<22} {median * 1e3:8.2f} ms  ({min(values) * 1e3:.2f}-{max(values) * 1e3:.2f})"
              f"  {ratio:6.2f}x no listener")


if __name__ == "__main__":
    main()
