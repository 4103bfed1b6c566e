"""Cost of the rank agreement (SPEC §14): a 2-rank gloo DDP step of a tiny model.

Three loops, run by both ranks in interleaved rounds (the order rotates each round):

- ``bare``: the DDP step alone;
- ``agreement``: the step plus `CollectiveAgreement.decide`, as a session runs it on a DDP model:
  the flags ride in DDP's own gradient all-reduce (supervisor.distributed.channel), so a step
  has no collective of its own;
- ``naive``: the step plus a blocking all_reduce of the same flags every step (the agreement
  done without overlap), for comparison;
- ``py_hook``: the step with the smallest Python communication hook DDP accepts (average and
  all-reduce the bucket, nothing else): the floor for any design that rides in DDP's all-reduce,
  since DDP's built-in reducer runs in C++ and a Python hook adds the GIL hand-over and DDP's
  wrapping of each bucket;
- ``raw_async``: the step plus a bare async all_reduce of the same tensor on the same kind of
  group, waited for at the next step, with none of the agreement's logic: the transport's own
  floor for any per-step collective on this machine.

Prints, for each loop, µs per step (median over rounds, min–max) and the per-round ratio over
``bare`` (median, min–max), twice: for the whole round (total time / steps: every scheduling
burst of the 2-core machine included) and for the typical step (the median of the round's
per-step times: robust to those bursts, which hit the loops at random and make the whole-round
ratio swing 0.7–1.6× from round to round). Target: agreement ≤ 1.05×. Figures are noisy.

``--instructions``: the same loops counted in CPU instructions under callgrind (rank 0 under
callgrind, rank 1 native; benchmarks/distributed_instructions.py), the target judged on them.

Run: ``python benchmarks/distributed.py [--quick] [--instructions [--n N] [--runs 1]]`` (spawns its ranks itself).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import distributed_instructions  # noqa: E402
from benchmarks._ddp_loops import LOOPS, rank_main  # noqa: E402
from benchmarks._ranks import run_ranks, spread  # noqa: E402

__all__ = ["LOOPS", "main"]


def main(argv: list[str] | None = None) -> dict[str, list[tuple[float, float, list[float]]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    parser.add_argument("--instructions", action="store_true", help="count instructions per step under "
                        "callgrind next to the timing ratios (benchmarks/distributed_instructions.py)")
    parser.add_argument("--n", type=int, default=200, help="--instructions: N (the 2N run minus the N run)")
    parser.add_argument("--runs", type=int, choices=(1, 2), default=2, help="--instructions: callgrind jobs "
                        "(default 2: their run-to-run difference; 1: a smoke run)")
    args = parser.parse_args(argv)
    if args.instructions:
        return distributed_instructions.main(["--n", str(args.n), "--runs", str(args.runs),
                                              *(["--rounds", "2", "--steps", "50", "--warmup", "2"]
                                                if args.quick else [])])
    rounds, steps = (3, 50) if args.quick else (30, 200)
    times = run_ranks(rank_main, rounds, steps)
    print(f"2-rank gloo DDP step of a tiny model, {rounds} interleaved rounds x {steps} steps "
          "(shared machine: noisy)")
    for index, title in ((0, "whole round (mean step, bursts included)"),
                         (1, "typical step (per-step median within the round)")):
        print(f"\n{title}")
        print(f"{'loop':<12}{'us/step median (min-max)':<32}{'ratio over bare, median (min-max)'}")
        for loop in LOOPS:
            values = [t[index] for t in times[loop]]
            ratios = [t[index] / b[index] for t, b in zip(times[loop], times["bare"])]
            verdict = ""
            if loop == "agreement":
                verdict = "  ok (target <= 1.05x)" if statistics.median(ratios) <= 1.05 else "  MISSES TARGET (<= 1.05x)"
                floor = [t[index] / b[index] for t, b in zip(times[loop], times["py_hook"])]
                verdict += f"; over py_hook {spread(floor, '{:.3f}x')}"
            print(f"{loop:<12}{spread(values, '{:.0f}'):<32}{spread(ratios, '{:.3f}x')}{verdict}")
    pooled = {loop: statistics.median(d for t in times[loop] for d in t[2]) * 1e6 for loop in LOOPS}
    print("\nall steps pooled (median of every step of every round): "
          + ", ".join(f"{loop} {pooled[loop]:.0f} us ({pooled[loop] / pooled['bare']:.3f}x)" for loop in LOOPS))
    return times


if __name__ == "__main__":
    main()
