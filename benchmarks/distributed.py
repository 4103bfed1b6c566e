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

Run: ``python benchmarks/distributed.py [--quick] [--instructions [--n N]]`` (spawns its ranks itself).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._ranks import run_ranks, spread  # noqa: E402

LOOPS = ("bare", "agreement", "py_hook", "naive", "raw_async")


class Rank:
    """One rank's models and groups, as every loop uses them (after ``init_process_group``)."""

    def __init__(self) -> None:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        def build() -> tuple[Any, Any]:
            torch.manual_seed(0)
            net = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                                              torch.nn.Linear(64, 4)))
            return net, torch.optim.SGD(net.parameters(), lr=0.01)

        # The agreement installs its channel (a comm hook) on the model it is given: that model is
        # used by the agreement loop only, so the other loops run DDP's built-in reducer.
        self.models = {"plain": build(), "agreement": build(), "py_hook": build()}
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

        self.models["py_hook"][0].register_comm_hook(None, minimal_hook)
        self.x, self.y = torch.randn(16, 32), torch.randint(0, 4, (16,))
        self.side = dist.new_group(backend="gloo")
        self.options = dist.AllreduceOptions()
        self.options.reduceOp = dist.ReduceOp.MAX

    def step(self, which: str = "plain") -> None:
        model, optimizer = self.models[which]
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(self.x), self.y).backward()
        optimizer.step()

    def loop(self, loop: str) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        """``(one step of the loop, finish, close)``: ``finish`` ends the loop's pending work
        (the agreement's last collective; a pending async all_reduce), ``close`` closes the
        agreement (not part of the loop's time)."""
        import torch.distributed as dist

        from supervisor.boundary import NO_REQUESTS
        from supervisor.distributed.agreement import CollectiveAgreement

        # Created outside the timed loop (a session creates it once, with the session).
        agreement = CollectiveAgreement(stop_grace_secs=60, modules=[self.models["agreement"][0]]) \
            if loop == "agreement" else None
        which = loop if loop in self.models else "plain"
        if agreement is not None:
            # Its first boundary makes the side group and starts the watchdog (a session pays
            # that once, at its first step): outside the timed loop, as the creation above.
            self.step(which)
            agreement.decide(0, NO_REQUESTS)
        flags = torch.zeros(4, dtype=torch.int32)
        state: dict[str, Any] = {"n": 0, "pending": None}

        def one() -> None:
            state["n"] += 1
            self.step(which)
            if agreement is not None:
                agreement.decide(state["n"], NO_REQUESTS)
            elif loop == "naive":
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.side)
            elif loop == "raw_async":
                if state["pending"] is not None:
                    state["pending"].wait()
                state["pending"] = self.side.allreduce([flags], self.options)

        def finish() -> None:
            if agreement is not None:
                agreement.decide(state["n"] + 1, _last())  # the agreed stop: waits for the last collective
            if state["pending"] is not None:
                state["pending"].wait()

        return one, finish, (agreement.close if agreement is not None else lambda: None)


def _init(rank: int, port: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method="env://")


def _rank_main(rank: int, port: int, rounds: int, steps: int, out: Any) -> None:
    import torch.distributed as dist

    _init(rank, port)
    ranks = Rank()

    def run(loop: str) -> tuple[float, float, list[float]]:
        one, finish, close = ranks.loop(loop)
        dist.barrier()
        start = time.perf_counter()
        marks = [start]
        for _ in range(steps):
            one()
            marks.append(time.perf_counter())
        finish()
        elapsed = time.perf_counter() - start
        close()
        each = [b - a for a, b in zip(marks, marks[1:])]
        return elapsed / steps * 1e6, statistics.median(each) * 1e6, each

    for _ in range(20):
        for which in ranks.models:
            ranks.step(which)
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
    parser.add_argument("--instructions", action="store_true", help="count instructions per step under "
                        "callgrind next to the timing ratios (benchmarks/distributed_instructions.py)")
    parser.add_argument("--n", type=int, default=200, help="--instructions: N (the 2N run minus the N run)")
    args = parser.parse_args(argv)
    if args.instructions:
        from benchmarks.distributed_instructions import main as instructions

        return instructions(["--n", str(args.n), *(["--rounds", "3", "--steps", "50", "--warmup", "5"]
                                                   if args.quick else [])])
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
