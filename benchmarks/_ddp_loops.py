"""The 2-rank gloo DDP loops that both distributed benchmarks run: `distributed.py` times them,
`distributed_instructions.py` counts their instructions under callgrind. Shared here so the two
import one module instead of each other (``distributed --instructions`` dispatches one way, to
`distributed_instructions`). What each loop is: benchmarks/distributed.py's docstring.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from supervisor.engine.boundary import NO_REQUESTS, Requests
from supervisor.distributed.agreement import CollectiveAgreement

LOOPS = ("bare", "agreement", "py_hook", "naive", "raw_async")


class Rank:
    """One rank's models and groups, as every loop uses them (after ``init_process_group``)."""

    def __init__(self) -> None:
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
                agreement.decide(state["n"] + 1, last_requests())  # the agreed stop: waits for the last collective
            if state["pending"] is not None:
                state["pending"].wait()

        return one, finish, (agreement.close if agreement is not None else lambda: None)


def init_rank(rank: int, port: int) -> None:
    """Joins the 2-rank gloo group on ``127.0.0.1:port`` as ``rank`` (one intra-op thread)."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method="env://")


def rank_main(rank: int, port: int, rounds: int, steps: int, out: Any) -> None:
    """One rank of the timed job: ``rounds`` interleaved rounds of every loop, ``steps`` steps
    each; rank 0 puts {loop: [(mean µs/step, median µs/step, every step's seconds)]} on ``out``."""
    init_rank(rank, port)
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


def last_requests() -> Requests:
    """The requests of the agreed stop that ends the agreement loop."""
    return Requests(stop_reason="benchmark over", stop_on_every_rank=True)
