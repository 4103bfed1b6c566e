"""How ``benchmarks/object_store.py`` measures and prints: the wall, client-CPU and server-CPU
seconds of each timed window (`Meter`), figures as median (min–max) with MB/s, CPU medians per
figure, and the ratios of medians with their targets (`report`, `print_table`)."""
from __future__ import annotations

import gc
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from benchmarks._ranks import spread

__all__ = ["Comparison", "Meter", "print_table", "report"]

MB = 1e6
Figures = dict[str, list[float | str]]  # figure -> seconds per round, or why it failed
Cpu = dict[str, list[tuple[float, float | None]]]  # figure -> (client, server) CPU seconds per round


@dataclass(frozen=True)
class Comparison:
    """One ratio of medians; ``ratio`` is None when a side failed or is not available."""

    name: str
    ratio: float | None
    target: float | None
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return f"n/a ({self.note})"
        if self.target is None:
            return "(info)"
        return "ok" if self.ratio <= self.target else "MISSES TARGET"


class Meter:
    """Times a window: wall seconds (returned) and, in ``last``, the CPU seconds this process
    (every thread: the client) and ``server_cpu()`` (the server process; None: unknown) used."""

    def __init__(self, server_cpu: Callable[[], float | None] = lambda: None) -> None:
        self.server_cpu = server_cpu
        self.last: tuple[float, float | None] = (0.0, None)

    def time(self, fn: Callable[[], object]) -> float:
        gc.collect()
        server, client, start = self.server_cpu(), _client_cpu(), time.perf_counter()
        fn()
        wall, client_after, server_after = time.perf_counter() - start, _client_cpu(), self.server_cpu()
        self.last = (client_after - client, None if server is None or server_after is None else server_after - server)
        return wall

    def time_or_failure(self, fn: Callable[[], object]) -> float | str:
        """The seconds ``fn`` took, or its failure as the figure."""
        try:
            return self.time(fn)
        except Exception as e:  # noqa: BLE001 - a failure is the figure
            return f"FAILED: {type(e).__name__}: {e}"[:300]


def _client_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _median(values: list[float | str]) -> float | None:
    numbers = [v for v in values if isinstance(v, float)]
    return statistics.median(numbers) if numbers and len(numbers) == len(values) else None


def _cpu_median(samples: list[tuple[float, float | None]]) -> tuple[float, float | None] | None:
    if not samples:
        return None
    servers = [s for _, s in samples if s is not None]
    return (statistics.median(c for c, _ in samples),
            statistics.median(servers) if len(servers) == len(samples) else None)


def report(label: str, header: str, nbytes: int, figures: Figures, cpu: Cpu,
           rows: list[tuple[str, str, str, float | None]]) -> list[Comparison]:
    """Prints every figure of one size, its CPU medians and its ratios; returns the ratios (of
    wall medians, then, as information, of client + server CPU medians)."""
    print(f"  {header}")
    for name in figures:
        values, middle = figures[name], _median(figures[name])
        if middle is None:
            shown = next(v for v in values if isinstance(v, str))
        else:
            shown = f"{spread([float(v) for v in values])} s  {nbytes / MB / middle:8.1f} MB/s"
        print(f"    {name:<42s} {shown}")
    print("  CPU seconds, medians (client: this process, all threads; server: the moto process):")
    totals: dict[str, float] = {}
    for name in figures:
        both = _cpu_median(cpu.get(name, []))
        if both is not None:
            server = "unknown" if both[1] is None else f"{both[1]:.3f}"
            print(f"    cpu of {name:<42s} client {both[0]:.3f}  server {server}")
            if both[1] is not None:
                totals[name] = both[0] + both[1]
    results = []
    for row, ours, theirs, target in rows:
        mine, other = _median(figures[ours]), _median(figures[theirs])
        if mine is None or other is None:
            failed = figures[ours] if mine is None else figures[theirs]
            note = next(v for v in failed if isinstance(v, str))
            results.append(Comparison(f"{row} @ {label}", None, target, note))
        else:
            results.append(Comparison(f"{row} @ {label}", mine / other, target))
    for row, ours, theirs, target in rows:
        if target is not None and ours in totals and theirs in totals:
            results.append(Comparison(f"cpu {row} @ {label}", totals[ours] / totals[theirs], None))
    return results


def print_table(results: list[Comparison]) -> None:
    print("\nratio of medians (SPEC 14: save to commit and verified restore <= 1.0x DCP's fsspec writer/reader;"
          " 'cpu' rows: client + server CPU seconds, information):")
    for r in results:
        figure = "" if r.ratio is None else f"{r.ratio:7.3f}x  "
        bound = "" if r.target is None or r.ratio is None else f"target <= {r.target:g}x  "
        print(f"  {r.name:<58s} {figure}{bound}{r.verdict}")
