"""Restore decided once (SPEC §4, §12): the chief chooses, every rank restores exactly that.

At every session creation the chief chooses the checkpoint as a single process would (the
index's choice, verified, falling back to older ones, §5.4), restores it, and posts its decision
— path and step, "start from scratch", or the error that stopped it — under one key of the
process group's store. Every other rank waits for that key (polling at most every second, for at
most ``max_wait_secs``), then restores exactly that path: never its own directory listing, so
ranks cannot diverge when a checkpoint commits meanwhile. A rank that gives up raises
`TimeoutError` naming the key, the chief and the time waited.

Keys are ``supervisor/restore/<torchrun attempt>/<creation number>``: every rank creates its
sessions in the same order, so the n-th creation of each rank reads the chief's n-th decision.
"""
from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass
from typing import Any

from supervisor import distributed
from supervisor.clock import Clock, resolve_clock

__all__ = ["RestoreDecision", "next_key", "publish_decision", "await_decision"]

logger = logging.getLogger(__name__)

_CREATIONS = itertools.count()
POLL_SECS = 0.2  # how often a waiting rank looks (SPEC: at least once a second)


@dataclass(frozen=True)
class RestoreDecision:
    """The chief's restore decision: a checkpoint (``path``, ``step``), scratch (both None), or
    the chief's ``error``."""

    path: str | None = None
    step: int | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "step": self.step, "error": self.error})

    @classmethod
    def from_json(cls, text: str) -> RestoreDecision:
        data = json.loads(text)
        return cls(data["path"], data["step"], data["error"])


def next_key() -> str:
    """The store key of this process's next session creation (call once per creation)."""
    return f"supervisor/restore/{distributed.attempt()}/{next(_CREATIONS)}"


def publish_decision(key: str, decision: RestoreDecision, store: Any = None) -> None:
    """The chief posts its decision for the creation ``key``."""
    (store or distributed.default_store()).set(key, decision.to_json())
    logger.debug("posted the restore decision %s under %s", decision, key)


def await_decision(key: str, *, max_wait_secs: float, store: Any = None, clock: Clock | None = None) -> RestoreDecision:
    """Waits for the chief's decision for ``key``.

    Raises:
        TimeoutError: no decision within ``max_wait_secs``; names what it waited for.
    """
    store = store or distributed.default_store()
    clock = resolve_clock(clock)
    start = last_log = clock.monotonic()
    while True:
        if store.check([key]):
            value = store.get(key)
            return RestoreDecision.from_json(value.decode("utf-8") if isinstance(value, bytes) else value)
        now = clock.monotonic()
        waited = now - start
        if waited >= max_wait_secs:
            raise TimeoutError(
                f"rank {distributed.rank()} waited {waited:.0f} s (max_wait_secs={max_wait_secs:g}) for the "
                f"chief's restore decision (store key {key!r}); the chief (rank 0) has not restored or "
                "initialised its state yet. Check that it is running and not stuck, or raise max_wait_secs")
        if now - last_log >= 30:
            logger.info("rank %d still waiting for the chief's restore decision (%.0f s)", distributed.rank(), waited)
            last_log = now
        clock.sleep(min(POLL_SECS, max_wait_secs - waited))


def decide_as_chief(restore: Any) -> Any:
    """Runs the chief's ``restore()`` (returns a `Restored` or None) and, in a distributed job,
    posts the outcome for the other ranks — also when it raises, so they fail at once with the
    chief's reason instead of waiting ``max_wait_secs``."""
    if not distributed.is_distributed():
        return restore()
    key = next_key()
    try:
        restored = restore()
    except BaseException as e:
        publish_decision(key, RestoreDecision(error=f"{type(e).__name__}: {e}"))
        raise
    if restored is None:
        publish_decision(key, RestoreDecision())
    else:
        publish_decision(key, RestoreDecision(restored.path, int(restored.global_step)))
    return restored


def follow_chief(state: Any, *, max_wait_secs: float, verify: str = "full", trusted_globals: Any = (),
                 save_rng: bool = True, clock: Clock | None = None) -> Any:
    """A non-chief rank's restore: waits for the chief's decision and restores exactly that
    checkpoint (verified again here); returns a `Restored`, or None when the chief started
    from scratch (this rank then runs ``init_fn`` as the chief did).

    Raises:
        TimeoutError: no decision within ``max_wait_secs``.
        RuntimeError: the chief failed to restore (its error is quoted).
    """
    from supervisor.checkpoint.restore import apply_checkpoint, load_verified

    decision = await_decision(next_key(), max_wait_secs=max_wait_secs, clock=clock)
    if decision.error is not None:
        raise RuntimeError(f"rank {distributed.rank()} cannot restore: the chief's restore failed with "
                           f"{decision.error}")
    if decision.path is None:
        logger.info("the chief starts from scratch; rank %d initialises too", distributed.rank())
        return None
    loaded = load_verified(decision.path, verify=verify, trusted_globals=trusted_globals, mmap=True)
    if loaded.step != decision.step:
        raise RuntimeError(f"{decision.path} holds step {loaded.step}, the chief restored step {decision.step}")
    return apply_checkpoint(loaded, state, restore_rng=save_rng)
