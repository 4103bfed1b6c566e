"""What the multi-process benchmarks share: two (or more) spawned gloo ranks on a free loopback
port, bounded in time, and how a figure is printed (median with min–max)."""
from __future__ import annotations

import socket
import statistics
from typing import Any, Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """``median (min-max)`` of ``values``."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def run_ranks(target: Callable[..., None], *args: Any, world_size: int = 2, timeout_secs: float = 900) -> Any:
    """Spawns ``target(rank, port, *args, queue)`` on each rank; returns what one rank puts on
    ``queue``. Every process is joined, or killed after 60 s, before this returns."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, port, *args, queue)) for rank in range(world_size)]
    try:
        for p in procs:
            p.start()
        return queue.get(timeout=timeout_secs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
