"""Naming the rank that failed (SPEC §12): when a collective fails, ask the store who is left.

A rank that raises posts its error under ``failed/<rank>`` in the group's store as it closes
its session; every rank that sees a collective fail posts ``alive/<rank>``. A rank that posted
neither within a short grace period is unresponsive (killed, or hung). The store is the one the
process group rendezvoused on, so this needs no connection of its own.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from supervisor.errors import SupervisorError

__all__ = ["RankFailureError", "diagnose", "post_failure"]

logger = logging.getLogger(__name__)


class RankFailureError(SupervisorError):
    """Another rank failed (raised, was killed or hung) and this rank cannot go on.

    Attributes:
        ranks: the ranks found failed or unresponsive (empty when the store could not tell).
        step: the step at which this rank noticed.
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), step: int | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.step = step


def post_failure(store: Any, rank: int, message: str) -> None:
    """Tells the other ranks this rank is leaving because of ``message`` (best effort)."""
    try:
        store.set(f"failed/{rank}", message[:2000])
    except Exception as e:  # noqa: BLE001 - the store's host may be the one that died
        logger.debug("could not post rank %d's failure to the store: %s", rank, e)


def diagnose(store: Any, rank: int, world_size: int, *, grace_secs: float) -> tuple[dict[int, str], list[int]]:
    """Returns ``({rank: its posted error}, [unresponsive ranks])`` as seen within ``grace_secs``."""
    try:
        store.set(f"alive/{rank}", "1")
    except Exception as e:  # noqa: BLE001
        logger.warning("the process group's store is unreachable (%s); its host (rank 0 or the "
                       "torchrun agent) may be gone", e)
        return {}, [r for r in range(world_size) if r != rank and r == 0]
    failed: dict[int, str] = {}
    deadline = time.monotonic() + grace_secs
    while True:
        silent = []
        for other in range(world_size):
            if other == rank or other in failed:
                continue
            try:
                if store.check([f"failed/{other}"]):
                    failed[other] = store.get(f"failed/{other}").decode("utf-8", "replace")
                elif not store.check([f"alive/{other}"]):
                    silent.append(other)
            except Exception:  # noqa: BLE001 - treat an unreadable store as silence
                silent.append(other)
        if not silent or time.monotonic() >= deadline:
            return failed, silent
        time.sleep(0.05)


def describe_failure(failed: dict[int, str], silent: list[int], grace_secs: float) -> str:
    """One sentence naming each failed rank and why."""
    parts = [f"rank {r} failed ({message})" for r, message in sorted(failed.items())]
    if silent:
        ranks = ", ".join(str(r) for r in silent)
        parts.append(f"rank {ranks} did not respond within {grace_secs:g} s (killed or hung)")
    return "; ".join(parts) if parts else "no rank reported a failure (a network problem?)"
