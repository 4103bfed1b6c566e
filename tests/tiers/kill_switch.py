"""The kill seams' trigger, shared by the tier tests' trainers (tier_trainer.py, one process;
tier_sharded_worker.py, a rank of a gloo job): SIGKILL this process the ``n``-th time it reaches
a named point, as an environment variable says, and a writer that reaches its point halfway."""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable


class KillSwitch:
    """``os.environ[variable]`` = ``"point:n"`` (or ``"point:n:rank"`` with ``rank`` given: that
    rank only) arms it; `reached` counts each point and SIGKILLs this process at the ``n``-th,
    after saying so: ``killing at POINT`` on stderr (``killing rank R at POINT`` on stdout for a rank)."""

    def __init__(self, variable: str, rank: Callable[[], int] | None = None) -> None:
        self._variable, self._rank, self._counts = variable, rank, {}

    def reached(self, point: str) -> None:
        spec = os.environ.get(self._variable, "")
        if not spec:
            return
        name, n, *rank = spec.split(":")
        if name != point or (rank and int(rank[0]) != self._rank()):  # type: ignore[misc]
            return
        self._counts[point] = self._counts.get(point, 0) + 1
        if self._counts[point] == int(n):
            if rank:
                print(f"killing rank {rank[0]} at {point}", flush=True)
            else:
                sys.stderr.write(f"killing at {point}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def half_writer(self, writer: Any, point: str) -> HalfWriter:
        return HalfWriter(writer, point, self)


class HalfWriter:
    """Passes writes through; reaches ``point`` after the first one (a half-written file)."""

    def __init__(self, writer: Any, point: str, switch: KillSwitch) -> None:
        self._writer, self._point, self._switch, self._writes = writer, point, switch, 0

    def write(self, data: Any) -> Any:
        written = self._writer.write(data)
        self._writes += 1
        if self._writes == 2:
            self._switch.reached(self._point)
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)
