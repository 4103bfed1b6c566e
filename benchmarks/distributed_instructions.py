"""``distributed.py --instructions``: the agreement's cost (SPEC §14, ≤ 1.05× the bare DDP step)
counted in CPU instructions under callgrind, next to the timing ratios.

Rank 0 runs under ``valgrind --tool=callgrind`` (every thread of that process counted: DDP's
reducer, gloo's threads, the agreement's watchdog); rank 1 runs natively, so it is always ahead
and rank 0's collectives find its part already there — rank 0's count is then its own work, not
time spent waiting (a blocked wait costs no instructions; a spinning one would, and would show
as a run-to-run difference). Each loop of benchmarks/distributed.py (bare, agreement, py_hook,
naive, raw_async) runs W warm-up steps, N steps and 2N steps; instructions per step =
(2N - N) / N (benchmarks._callgrind). The job runs twice and both counts are printed (``--runs 1``:
once, a smoke run).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _callgrind  # noqa: E402
from benchmarks._ddp_loops import LOOPS, Rank, init_rank, rank_main  # noqa: E402
from benchmarks._ranks import free_port, run_ranks, spread  # noqa: E402

TARGET = 1.05


def worker(rank: int, port: int, n: int, warmup: int) -> None:
    init_rank(rank, port)
    ranks = Rank()
    marks: list[str] = []
    _callgrind.start()
    _callgrind.mark()
    marks.append("start")
    for loop in LOOPS:
        one, finish, close = ranks.loop(loop)
        dist.barrier()
        _callgrind.steady_phases(loop, one, n, warmup, marks)
        finish()
        close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        _callgrind.print_marks(marks)


def job(n: int, warmup: int, timeout_secs: float = 1500) -> dict[str, int]:
    """One 2-rank job: rank 0 under callgrind, rank 1 native. Returns rank 0's counts."""
    port = free_port()
    argv = [os.path.abspath(__file__), "--worker", "--port", str(port), "--n", str(n), "--warmup", str(warmup)]
    native = subprocess.Popen([sys.executable, *argv, "--rank", "1"], stdout=subprocess.DEVNULL)
    try:
        counts, _ = _callgrind.run_worker([*argv, "--rank", "0"], timeout_secs, main_thread=True)
        native.wait(timeout=60)
        return counts
    finally:
        if native.poll() is None:
            native.kill()
            native.wait()


def report_instructions(n: int, warmup: int, runs: int = 2) -> dict[str, float]:
    """``runs`` jobs (2: the run-to-run difference; 1: a smoke run), their tables printed."""
    with ThreadPoolExecutor(2) as pool:
        first, *rest = [f.result() for f in [pool.submit(job, n, warmup) for _ in range(runs)]]
    second = rest[0] if rest else None
    a = {loop: _callgrind.per_step(first, loop, n) for loop in LOOPS}
    b = {loop: None if second is None else _callgrind.per_step(second, loop, n) for loop in LOOPS}
    print(f"instructions per steady-state step of rank 0 (callgrind, every thread of rank 0; rank 1 "
          f"native; (2N - N) / N with N = {n} after {warmup} warm-up steps), {'two runs' if second else 'one run'}; "
          f"target: agreement <= {TARGET:.2f}x bare:")
    ratios = _table(a, b)
    a = {loop: _callgrind.per_step(first, f"{loop}:2N [main thread]", n, raw=True) for loop in LOOPS}
    b = {loop: None if second is None else _callgrind.per_step(second, f"{loop}:2N [main thread]", n, raw=True)
         for loop in LOOPS}
    print("the same, the training thread alone (gloo's transport threads poll epoll every 10 ms, so "
          "under callgrind's slowdown their count follows the wall time, not the work):")
    main_ratios = _table(a, b)
    if all(first[f"{loop}:2N"] == first[f"{loop}:2N [main thread]"] for loop in LOOPS):
        print("  NOTE: with --separate-threads=yes callgrind dumped the training thread only (every-thread "
              "total = the training thread's), so the first table is not every thread here; a run without "
              "--separate-threads counts all of them (rank 0's gloo threads made it vary 1-10 % between runs)")
    ratios.update({f"{loop} [main thread]": value for loop, value in main_ratios.items()})
    return ratios


def _table(a: dict[str, float], b: dict[str, float | None]) -> dict[str, float]:
    print(f"  {'loop':<12s} {'run 1':>10s} {'run 2':>10s}  run-to-run                     ratio over bare")
    ratios = {}
    for loop in LOOPS:
        ratios[loop] = a[loop] / a["bare"]
        verdict = ""
        if loop == "agreement":
            verdict = "  " + ("ok" if ratios[loop] <= TARGET else "MISSES TARGET") + \
                f"; over py_hook {a[loop] / a['py_hook']:.4f}x"
        second = "-" if b[loop] is None else f"{b[loop] / b['bare']:.4f}x"  # type: ignore[operator]
        print(f"  {loop:<12s} {a[loop]:10.0f} {_callgrind.second_run(b[loop])}  "
              f"{_callgrind.run_to_run(a[loop], b[loop]):<30s} {ratios[loop]:.4f}x (run 2: {second}){verdict}")
    return ratios


def report_timing(rounds: int, steps: int) -> None:
    times = run_ranks(rank_main, rounds, steps)
    print(f"timing (2 ranks native, {rounds} interleaved rounds x {steps} steps; typical step = per-step median "
          "within the round), ratio over bare, median (min-max):")
    for loop in LOOPS:
        ratios = [t[1] / b[1] for t, b in zip(times[loop], times["bare"])]
        whole = [t[0] / b[0] for t, b in zip(times[loop], times["bare"])]
        print(f"  {loop:<12s} typical step {spread(ratios, '{:.3f}x')}   whole round {spread(whole, '{:.3f}x')}")


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--n", type=int, default=200, help="N steps (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up steps per loop (default 20)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the timing ratios (0: none)")
    parser.add_argument("--steps", type=int, default=200, help="steps per timed round")
    parser.add_argument("--runs", type=int, choices=(1, 2), default=2, help="callgrind jobs (default 2: their "
                        "run-to-run difference; 1: the counts alone, a smoke run)")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.rank, args.port, args.n, args.warmup)
        _callgrind.exit_worker()
    why = _callgrind.available()
    if why is not None:
        print(f"instruction counts not available: {why}")
        return None
    if args.rounds:
        report_timing(args.rounds, args.steps)
        print()
    return report_instructions(args.n, args.warmup, args.runs)


if __name__ == "__main__":
    main()
