"""``step_overhead.py --instructions``: the step-overhead ratios (SPEC §14) counted in CPU
instructions under callgrind, all threads of the process included, next to the timing ratios.

One worker process (under ``valgrind --tool=callgrind``) runs every variant in turn: the tiny
CPU model's bare loop, the same loop inside `MonitoredSession` (no hooks), inside
`MonitoredTrainingSession` with and without its default hooks, inside
``Supervisor.managed_session()`` with its default services, and a no-op step called bare and
through ``MonitoredSession.run()``. Each runs W warm-up steps, N steps and 2N steps
(`benchmarks._callgrind`): instructions per step = (2N - N) / N, the steady state. The worker
runs twice (``--runs 1``: once, a smoke run); the two counts are printed with their difference
(deterministic: ≤ 0.1 %). The targets are judged on the instruction ratios: MTS default hooks
and Supervisor default services ≤ 1.03× the bare loop. With ``--annotate``, each variant that
misses is broken down by function (callgrind_annotate of its per-step dumps minus the bare loop's).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _callgrind  # noqa: E402
from benchmarks._heap import frozen_heap  # noqa: E402
from benchmarks._step_loops import SESSIONS, report_loops, session_factories, settled, tiny_model  # noqa: E402
from supervisor import MonitoredSession  # noqa: E402

TARGET = 1.03
JUDGED = ("MonitoredTrainingSession, default hooks", "Supervisor.managed_session(), default services")


def preload(factories: dict[str, Callable[..., object]]) -> None:
    """One step of every variant before callgrind's instrumentation starts. Their first use
    imports ~1,100 modules lazily (the optimizer: torch._dynamo, sympy; the summary writer:
    tensorboard): ~35 s of CPU per worker when instrumented, a few seconds before. The counts do
    not change: a one-time cost falls in a variant's warm-up, outside (2N - N)."""
    _, _, batch, train_step = tiny_model()
    train_step(batch)
    for make in factories.values():
        model, opt, batch, train_step = tiny_model()
        with make(model, opt) as s:
            settled(s).run(train_step, batch)


def worker(n: int, warmup: int) -> None:
    """Runs under callgrind: every variant's W, N, 2N phases, then prints the marks' labels."""
    torch.set_num_threads(1)
    marks: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        factories = session_factories(tmp)
        preload(factories)
        _callgrind.start()
        _callgrind.mark()
        marks.append("start")
        _, _, batch, train_step = tiny_model()
        _callgrind.steady_phases("bare loop", lambda: train_step(batch), n, warmup, marks)
        for name, make in factories.items():
            model, opt, batch, train_step = tiny_model()
            with make(model, opt) as s:
                settled(s)
                _callgrind.steady_phases(name, lambda: s.run(train_step, batch), n, warmup, marks)
    output = {"loss": torch.tensor(0.5)}

    def noop() -> dict[str, torch.Tensor]:
        return output

    _callgrind.steady_phases("no-op step, called bare", noop, n, warmup, marks)
    with MonitoredSession(hooks=[]) as s:
        _callgrind.steady_phases("no-op step, MonitoredSession.run()", lambda: s.run(noop), n, warmup, marks)
    _callgrind.print_marks(marks)


def worker_argv(n: int, warmup: int) -> list[str]:
    return [os.path.abspath(__file__), "--worker", "--n", str(n), "--warmup", str(warmup)]


def report_instructions(n: int, warmup: int, annotate: bool = False, runs: int = 2) -> dict[str, float]:
    """Runs the worker under callgrind (twice: ``runs``) and prints instructions per step and ratios."""
    first, second = _callgrind.run_once_or_twice(worker_argv(n, warmup), runs)
    a = {name: _callgrind.per_step(first, name, n) for name in ("bare loop", *SESSIONS)}
    b = {name: None if second is None else _callgrind.per_step(second, name, n) for name in ("bare loop", *SESSIONS)}
    print(f"instructions per steady-state step (callgrind, every thread of the process; (2N - N) / N "
          f"with N = {n} after {warmup} warm-up steps), {'two runs' if second else 'one run'}; target <= "
          f"{TARGET:.2f}x on MTS default hooks and Supervisor default services:")
    print(f"  {'variant':<52s} {'run 1':>10s} {'run 2':>10s}  run-to-run         ratio over bare")
    ratios: dict[str, float] = {}
    for name in ("bare loop", *SESSIONS):
        ratio = a[name] / a["bare loop"]
        ratios[name] = ratio
        verdict = "" if name == "bare loop" else (
            f"{ratio:.4f}x  " + ("ok" if ratio <= TARGET else "MISSES TARGET") if name in JUDGED
            else f"{ratio:.4f}x  (info)")
        print(f"  {name:<52s} {a[name]:10.0f} {_callgrind.second_run(b[name])}  "
              f"{_callgrind.run_to_run(a[name], b[name]):<18s} {verdict}")
    extra, extra_2 = (None if counts is None else _callgrind.per_step(counts, "no-op step, MonitoredSession.run()", n)
                      - _callgrind.per_step(counts, "no-op step, called bare", n) for counts in (first, second))
    ratios["run() no-op extra instructions"] = extra
    print(f"  run() of a no-op step, 0 hooks: {extra:.0f} instructions more than calling the step "
          f"(run 2: {'-' if extra_2 is None else f'{extra_2:.0f}'}), = {(a['bare loop'] + extra) / a['bare loop']:.4f}x "
          "the tiny model's bare step if added to it")
    if annotate:
        for name in JUDGED:
            if ratios[name] > TARGET:
                print_breakdown(name, n, warmup)
    return ratios


def _functions(path: str) -> dict[str, int]:
    """Exclusive instructions per function of one callgrind dump."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    costs: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].replace(",", "").isdigit() and ":" in parts[1]:
            fn = parts[1].split(")", 1)[-1].strip() if parts[1].startswith("(") else parts[1]
            costs[fn] = costs.get(fn, 0) + int(parts[0].replace(",", ""))
    return costs


def print_breakdown(name: str, n: int, warmup: int, top: int = 15) -> None:
    """Per-step instructions by function, the variant minus the bare loop (callgrind_annotate
    of each one's 2N dump minus its N dump)."""
    with tempfile.TemporaryDirectory() as keep:
        counts, out_dir = _callgrind.run_worker(worker_argv(n, warmup), keep=keep)
        labels = list(counts)
        dumps = sorted((f for f in os.listdir(out_dir) if f.rsplit(".", 1)[-1].isdigit()
                        and f.count(".") == 2), key=lambda f: int(f.rsplit(".", 1)[1]))
        files = dict(zip(labels, (os.path.join(out_dir, f) for f in dumps)))

        def step_costs(label: str) -> dict[str, int]:
            big, small = _functions(files[f"{label}:2N"]), _functions(files[f"{label}:N"])
            return {fn: big.get(fn, 0) - small.get(fn, 0) for fn in set(big) | set(small)}

        variant, bare = step_costs(name), step_costs("bare loop")
        diff = sorted(((variant.get(fn, 0) - bare.get(fn, 0)) / n, fn) for fn in set(variant) | set(bare))
        print(f"  what {name} costs per step over the bare loop, by function (instructions, top {top}):")
        for cost, fn in sorted(diff, key=lambda x: -abs(x[0]))[:top]:
            print(f"    {cost:+10.0f}  {fn[:110]}")


def main(argv: list[str] | None = None, cpus: set[int] | None = None) -> None:
    """``cpus``: the CPUs the two callgrind workers may run on (a caller that pinned itself to one
    for the timing ratios passes the set it had: they inherit its mask and would share one CPU)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=500, help="N steps (the 2N run minus the N run; default 500)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up steps per variant (default 100)")
    parser.add_argument("--loop-rounds", type=int, default=7, help="rounds of the timing ratios (0: none)")
    parser.add_argument("--steps", type=int, default=3_000, help="steps per timed loop")
    parser.add_argument("--annotate", action="store_true", help="break down each variant that misses by function")
    parser.add_argument("--runs", type=int, choices=(1, 2), default=2, help="callgrind runs (default 2: their "
                        "run-to-run difference; 1: the counts alone, a smoke run)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.n, args.warmup)
        _callgrind.exit_worker()
    why = _callgrind.available()
    if why is not None:
        print(f"instruction counts not available: {why}")
        return None
    if args.loop_rounds:
        with tempfile.TemporaryDirectory() as tmp, frozen_heap():
            report_loops(args.loop_rounds, args.steps, session_factories(tmp), {})
        print()
    if cpus:
        os.sched_setaffinity(0, cpus)
    report_instructions(args.n, args.warmup, args.annotate, args.runs)
    return None


if __name__ == "__main__":
    main()
