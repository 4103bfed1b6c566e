"""Step overhead of the session runtime (SPEC §14), measured side by side in one run.

Prints:
- µs per ``run()`` of a no-op step function: no hooks, 5 hooks that override nothing, and
  5 hooks whose ``before_run``/``after_run`` are no-ops (target ≤ 5 µs);
- the ratio of a tiny CPU model's training loop inside `MonitoredSession` over the same bare
  loop (target ≤ 1.03×).

Timing: each variant is run in alternating rounds and the best round is kept, so a noisy
neighbour on a 2-core machine inflates no variant more than another.

Run: ``python benchmarks/step_overhead.py [--quick]``
"""
from __future__ import annotations

import argparse
import gc
import time
from typing import Callable

import torch

from supervisor import Hook, MonitoredSession

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


def report_loops(rounds: int, n: int, sessions: dict[str, Callable[..., object]]) -> dict[str, float]:
    variants = {"bare loop": bare_loop(n)}
    variants.update({name: session_loop(n, make) for name, make in sessions.items()})
    results = best_of(rounds, variants)
    bare = results["bare loop"]
    print(f"tiny CPU model, {n} steps (target <= 1.03x of the bare loop):")
    print(f"  {'bare loop':<48s} {bare / n * 1e6:8.1f} us/step")
    for name in sessions:
        ratio = results[name] / bare
        print(f"  {name:<48s} {results[name] / n * 1e6:8.1f} us/step  {ratio:.3f}x  "
              f"{'ok' if ratio <= 1.03 else 'MISSES TARGET'}")
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds (smoke test)")
    args = parser.parse_args(argv)
    rounds, n_noop, n_model = (2, 2_000, 200) if args.quick else (7, 50_000, 3_000)
    print(f"torch {torch.__version__}, 1 intra-op thread, best of {rounds} alternating rounds\n")
    report_noop(rounds, n_noop)
    print()
    report_loops(rounds, n_model, {"MonitoredSession, no hooks": monitored_session})


if __name__ == "__main__":
    main()
