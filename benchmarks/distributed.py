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

Run: ``python benchmarks/distributed.py [--quick]`` (spawns its two ranks itself).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._ranks import run_ranks, spread  # noqa: E402

LOOPS = ("bare", "agreement", "py_hook", "naive", "raw_async")


def _rank_main(rank: int, port: int, rounds: int, steps: int, out: Any) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from supervisor.boundary import NO_REQUESTS
    from supervisor.distributed.agreement import CollectiveAgreement

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method="env://")
    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)
        net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                          torch.nn.Linear(64, 4)))
        return net, torch.optim.SGD(net.parameters(), lr=0.01)

    # The agreement installs its channel (a comm hook) on the model it is given: that model is
    # used by the agreement loop only, so the other loops run DDP's built-in reducer.
    models = {"plain": build(), "agreement": build(), "py_hook": build()}
    world = dist.distributed_c10d._get_default_group()
    average = dist.AllreduceOptions()

    def minimal_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
        buffer = bucket.buffer()
        buffer.mul_(0.5)
        work = world.allreduce([buffer], average)
        work.wait()
        future: Any = torch.futures.Future()
        future.set_result(buffer)
        return future

    models["py_hook"][0].register_comm_hook(None, minimal_hook)
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    side = dist.new_group(backend="gloo")
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX

    def step(which: str = "plain") -> None:
        model, optimizer = models[which]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    def run(loop: str) -> float:
        # Created outside the timed loop (a session creates it once, with the session).
        agreement = CollectiveAgreement(stop_grace_secs=60, modules=[models["agreement"][0]]) \
            if loop == "agreement" else None
        which = loop if loop in models else "plain"
        if agreement is not None:
            # Its first boundary makes the side group and starts the watchdog (a session pays
            # that once, at its first step): outside the timed loop, as the creation above.
            step(which)
            agreement.decide(0, NO_REQUESTS)
        flags = torch.zeros(4, dtype=torch.int32)
        pending = None
        dist.barrier()
        start = time.perf_counter()
        marks = [start]
        for n in range(1, steps + 1):
            step(which)
            if agreement is not None:
                agreement.decide(n, NO_REQUESTS)
            elif loop == "naive":
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=side)
            elif loop == "raw_async":
                if pending is not None:
                    pending.wait()
                pending = side.allreduce([flags], options)
            marks.append(time.perf_counter())
        if agreement is not None:
            agreement.decide(steps + 1, _last())  # the agreed stop: waits for the last collective
        if pending is not None:
            pending.wait()
        elapsed = time.perf_counter() - start
        if agreement is not None:
            agreement.close()
        each = [b - a for a, b in zip(marks, marks[1:])]
        return elapsed / steps * 1e6, statistics.median(each) * 1e6, each

    for _ in range(20):
        for which in models:
            step(which)
    times: dict[str, list[tuple[float, float, list[float]]]] = {loop: [] for loop in LOOPS}
    for r in range(rounds):
        order = LOOPS[r % len(LOOPS):] + LOOPS[:r % len(LOOPS)]
        for loop in order:
            times[loop].append(run(loop))
    if rank == 0:
        out.put(times)
    dist.barrier()
    dist.destroy_process_group()


def _last() -> Any:
    from supervisor.boundary import Requests

    return Requests(stop_reason="benchmark over", stop_on_every_rank=True)


def main(argv: list[str] | None = None) -> dict[str, list[tuple[float, float, list[float]]]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    args = parser.parse_args(argv)
    rounds, steps = (3, 50) if args.quick else (30, 200)
    times = run_ranks(_rank_main, rounds, steps)
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
