"""The tiny-CPU-model training loop that both step benchmarks measure: `step_overhead.py`
times it, `step_instructions.py` counts its instructions under callgrind. Shared here so the
two import one module instead of each other (``step_overhead --instructions`` dispatches one
way, to `step_instructions`).

The variants: the bare loop, and the same loop inside `MonitoredSession` (no hooks),
`MonitoredTrainingSession` with and without its default hooks, and
``Supervisor.managed_session()`` with its default services (`session_factories`).
"""
from __future__ import annotations

import gc
import os
import shutil
import statistics
import time
from typing import Callable

import torch

from supervisor import (MonitoredSession, MonitoredTrainingSession, SessionCreator, Supervisor,
                        TrainingState)

SESSIONS = ("MonitoredSession, no hooks", "MonitoredTrainingSession, default hooks",
            "MonitoredTrainingSession, no default hooks", "Supervisor.managed_session(), default services")


def session_factories(tmp: str) -> dict[str, Callable[..., object]]:
    """{variant name: make(model, optimizer) -> session}, each with its own logdir under ``tmp``."""
    return {
        SESSIONS[0]: monitored_session,
        SESSIONS[1]: training_session(os.path.join(tmp, "mts")),
        SESSIONS[2]: training_session_no_default_hooks(os.path.join(tmp, "mts-bare")),
        SESSIONS[3]: supervisor_session(os.path.join(tmp, "sv")),
    }


def settled(session: object) -> object:
    """Waits for the checkpoint saved at session creation: it is not per-step overhead."""
    manager = getattr(session, "checkpoint_manager", None)
    if manager is not None:
        manager.wait()
    return session


def tiny_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)

    def train_step(batch):
        xb, yb = batch
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    return model, opt, (x, y), train_step


def bare_loop(n: int) -> Callable[[], tuple[float, float]]:
    """(wall seconds, this process's CPU seconds) of ``n`` bare steps."""
    def measure() -> tuple[float, float]:
        _, _, batch, train_step = tiny_model()
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(n):
            train_step(batch)
        return time.perf_counter() - start, time.process_time() - cpu_start
    return measure


def session_loop(n: int, make_session: Callable[..., object]) -> Callable[[], tuple[float, float]]:
    """As `bare_loop`, inside the session ``make_session`` makes. ``time.process_time`` counts
    every thread of this process — the runtime's background threads included — and nothing of
    other processes, so its ratio is the whole-loop cost with a shared machine's noise removed."""
    def measure() -> tuple[float, float]:
        model, opt, batch, train_step = tiny_model()
        with make_session(model, opt) as s:
            settled(s)
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(n):
                s.run(train_step, batch)
            return time.perf_counter() - start, time.process_time() - cpu_start
    return measure


def monitored_session(model, opt):
    return MonitoredSession(SessionCreator(TrainingState.from_arguments(model=model, optimizer=opt)))


def training_session(logdir: str) -> Callable[..., object]:
    def make(model, opt):
        shutil.rmtree(logdir, ignore_errors=True)
        return MonitoredTrainingSession(logdir, model, opt, handle_signals=False)
    return make


def training_session_no_default_hooks(logdir: str) -> Callable[..., object]:
    """MonitoredTrainingSession with the same checkpoint directory but none of its default
    hooks (no step counter, no summary saver, no periodic checkpoint saver): the gap between
    this row and the default-hooks row is what those hooks cost in a whole loop."""
    def make(model, opt):
        shutil.rmtree(logdir, ignore_errors=True)
        return MonitoredTrainingSession(logdir, model, opt, handle_signals=False, log_step_count_steps=None,
                                        save_summaries_steps=None, save_checkpoint_secs=None)
    return make


def supervisor_session(logdir: str) -> Callable[..., object]:
    def make(model, opt):
        shutil.rmtree(logdir, ignore_errors=True)
        return Supervisor(logdir, model, opt, handle_signals=False).managed_session()
    return make


def measure_bracketed(rounds: int, bare: Callable[[], tuple[float, float]],
                      variants: dict[str, Callable[[], tuple[float, float]]]
                      ) -> tuple[list[float], dict[str, list[tuple[float, float, float]]]]:
    """Each round runs every variant between two runs of ``bare`` (bare, v1, bare, v2, …, bare;
    the variants' order rotates each round). Every run returns (wall seconds, CPU seconds). A
    variant's ratio in a round is its time over the mean of the two bare runs around it: this
    machine's speed drifts, and the bare runs next to a variant saw the speed closest to its own.
    Returns every bare run's wall time, and per variant and round (wall seconds, wall ratio,
    CPU ratio)."""
    bares: list[float] = []
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(rounds):
        gc.collect()
        before = bare()
        bares.append(before[0])
        for name in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()
            wall, cpu = variants[name]()
            gc.collect()
            after = bare()
            bares.append(after[0])
            results[name].append((wall, wall / ((before[0] + after[0]) / 2), cpu / ((before[1] + after[1]) / 2)))
            before = after
    return bares, results


def report_loops(rounds: int, n: int, sessions: dict[str, Callable[..., object]],
                 others: dict[str, Callable[[], tuple[float, float]]]) -> dict[str, float]:
    variants = {name: session_loop(n, make) for name, make in sessions.items()}
    variants.update(others)
    bare, results = measure_bracketed(rounds, bare_loop(n), variants)
    print(f"tiny CPU model, {n} steps; each round runs every variant between two bare loops; ratio = "
          f"median (min-max) over {rounds} rounds of (variant / mean of the two bare loops around "
          "it), target <= 1.03x:")
    print(f"  {'bare loop':<52s} {statistics.median(bare) / n * 1e6:8.1f} us/step (median run; "
          f"{min(bare) / n * 1e6:.1f}-{max(bare) / n * 1e6:.1f})")
    ratios = {}
    for name in [*sessions, *others]:
        per_round = [r[1] for r in results[name]]
        ratios[name] = statistics.median(per_round)
        verdict = ("ok" if ratios[name] <= 1.03 else "MISSES TARGET") if name in sessions else "(reference)"
        print(f"  {name:<52s} {statistics.median(r[0] for r in results[name]) / n * 1e6:8.1f} us/step  "
              f"{ratios[name]:.3f}x ({min(per_round):.3f}-{max(per_round):.3f})  {verdict}")
    print("  all rounds pooled (the variant's total time over the total of the bare loops' means "
          "around it: every round's bursts count, none is dropped):")
    for name in [*sessions, *others]:
        pooled = sum(r[0] for r in results[name]) / sum(r[0] / r[1] for r in results[name])
        ratios[f"{name} (pooled)"] = pooled
        verdict = ("ok" if pooled <= 1.03 else "MISSES TARGET") if name in sessions else "(reference)"
        print(f"  {name:<52s} {pooled:.3f}x  {verdict}")
    print("  the same loops in CPU time of this process (time.process_time: the runtime's threads "
          "included, other processes' load excluded), ratio per round, median (min-max):")
    for name in sessions:
        per_round = [r[2] for r in results[name]]
        ratio = statistics.median(per_round)
        ratios[f"{name} (cpu)"] = ratio
        print(f"  {name:<52s} {ratio:.3f}x ({min(per_round):.3f}-{max(per_round):.3f})  "
              f"{'ok' if ratio <= 1.03 else 'MISSES TARGET'}")
    ratios["_bare_step_us"] = min(bare) / n * 1e6
    return ratios
