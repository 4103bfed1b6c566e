"""Step overhead of the session runtime (SPEC §14), measured side by side in one run.

Prints:
- µs per ``run()`` of a no-op step function: no hooks, 5 hooks that override nothing, and
  5 hooks whose ``before_run``/``after_run`` are no-ops (target ≤ 5 µs);
- the cost of each built-in hook on a non-triggering step (target ≤ 2 µs, except hooks that
  must read a value every step);
- the ratio of a tiny CPU model's training loop inside `MonitoredSession`, inside
  `MonitoredTrainingSession` with its default hooks, and inside `Supervisor.managed_session()`
  with its default services, over the same bare loop (target ≤ 1.03×), and pytorch-ignite's
  `Engine` on the same loop when it is installed.

Timing: each variant is run in alternating rounds and the best round is kept, so a noisy
neighbour on a 2-core machine inflates no variant more than another.

Run: ``python benchmarks/step_overhead.py [--quick]``
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor import Hook, MonitoredSession  # noqa: E402

torch.set_num_threads(1)


class NoOverrides(Hook):
    """A hook that overrides nothing: the session must skip it on every path."""


class NoOpRunHook(Hook):
    def before_run(self, run_context):
        return None

    def after_run(self, run_context, run_values):
        pass


def best_of(rounds: int, variants: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Runs each variant ``rounds`` times, alternating, and keeps each one's fastest round."""
    best = {name: float("inf") for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            gc.collect()
            best[name] = min(best[name], fn())
    return best


def noop_run_cost(hooks: list[Hook], n: int) -> Callable[[], float]:
    def measure() -> float:
        def step():
            return None
        with MonitoredSession(hooks=hooks) as s:
            run = s.run
            start = time.perf_counter()
            for _ in range(n):
                run(step)
            return (time.perf_counter() - start) / n * 1e6
    return measure


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


def bare_loop(n: int) -> Callable[[], float]:
    def measure() -> float:
        _, _, batch, train_step = tiny_model()
        start = time.perf_counter()
        for _ in range(n):
            train_step(batch)
        return time.perf_counter() - start
    return measure


def session_loop(n: int, make_session: Callable[..., object]) -> Callable[[], float]:
    def measure() -> float:
        model, opt, batch, train_step = tiny_model()
        with make_session(model, opt) as s:
            start = time.perf_counter()
            for _ in range(n):
                s.run(train_step, batch)
            return time.perf_counter() - start
    return measure


def monitored_session(model, opt):
    from supervisor import SessionCreator, TrainingState
    return MonitoredSession(SessionCreator(TrainingState.from_arguments(model=model, optimizer=opt)))


def training_session(logdir: str) -> Callable[..., object]:
    def make(model, opt):
        from supervisor import MonitoredTrainingSession
        shutil.rmtree(logdir, ignore_errors=True)
        return MonitoredTrainingSession(logdir, model, opt, handle_signals=False)
    return make


def supervisor_session(logdir: str) -> Callable[..., object]:
    def make(model, opt):
        from supervisor import Supervisor
        shutil.rmtree(logdir, ignore_errors=True)
        return Supervisor(logdir, model, opt, handle_signals=False).managed_session()
    return make


def ignite_loop(n: int) -> Callable[[], float] | None:
    try:
        from ignite.engine import Engine
    except ImportError:
        return None

    def measure() -> float:
        _, _, batch, train_step = tiny_model()
        engine = Engine(lambda _engine, b: train_step(b))
        data = [batch] * n
        start = time.perf_counter()
        engine.run(data, max_epochs=1)
        return time.perf_counter() - start
    return measure


def report_noop(rounds: int, n: int) -> dict[str, float]:
    results = best_of(rounds, {
        "0 hooks": noop_run_cost([], n),
        "5 hooks overriding nothing": noop_run_cost([NoOverrides() for _ in range(5)], n),
        "5 no-op before_run/after_run hooks": noop_run_cost([NoOpRunHook() for _ in range(5)], n),
    })
    print("run() of a no-op step (target <= 5 us):")
    for name, us in results.items():
        print(f"  {name:<40s} {us:7.2f} us/step  {'ok' if us <= 5 else 'MISSES TARGET'}")
    return results


def report_loops(rounds: int, n: int, sessions: dict[str, Callable[..., object]],
                 others: dict[str, Callable[[], float]]) -> dict[str, float]:
    variants = {"bare loop": bare_loop(n)}
    variants.update({name: session_loop(n, make) for name, make in sessions.items()})
    variants.update(others)
    results = best_of(rounds, variants)
    bare = results["bare loop"]
    print(f"tiny CPU model, {n} steps, best round of each (target <= 1.03x of the bare loop):")
    print(f"  {'bare loop':<56s} {bare / n * 1e6:8.1f} us/step")
    for name in [*sessions, *others]:
        ratio = results[name] / bare
        verdict = ("ok" if ratio <= 1.03 else "MISSES TARGET") if name in sessions else "(reference)"
        print(f"  {name:<56s} {results[name] / n * 1e6:8.1f} us/step  {ratio:.3f}x  {verdict}")
    return results


def report_hook_costs(n: int, rounds: int) -> None:
    from benchmarks.hook_costs import measure_hook_costs

    print("built-in hooks, us per non-triggering step over the no-hook baseline (target <= 2 us):")
    for name, us in measure_hook_costs(n_steps=n, rounds=rounds):
        print(f"  {name:<40s} {us:7.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (smoke test)")
    args = parser.parse_args(argv)
    rounds, n_noop, n_model = (2, 2_000, 200) if args.quick else (7, 50_000, 3_000)
    print(f"torch {torch.__version__}, 1 intra-op thread, best of {rounds} alternating rounds\n")
    report_noop(rounds, n_noop)
    print()
    report_hook_costs(n_noop // 2, rounds)
    print()
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {
            "MonitoredSession, no hooks": monitored_session,
            "MonitoredTrainingSession, default hooks": training_session(os.path.join(tmp, "mts")),
            "Supervisor.managed_session(), default services": supervisor_session(os.path.join(tmp, "sv")),
        }
        ignite = ignite_loop(n_model)
        others = {"pytorch-ignite Engine": ignite} if ignite is not None else {}
        report_loops(rounds, n_model, sessions, others)
        if ignite is None:
            print("  (pytorch-ignite not installed: pip install pytorch-ignite to compare)")


if __name__ == "__main__":
    main()
