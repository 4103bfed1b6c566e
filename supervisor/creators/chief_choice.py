"""The chief's choice, followed by every rank (SPEC §4, §12): the creators' side of it.

The chief's creator restores as a single process would and posts what it did (`decide_as_chief`;
from scratch with an ``init_fn``: `initialise_as_chief`, which runs it and broadcasts the state);
every other rank's creator waits for that decision and restores exactly that checkpoint
(`follow_chief`), through the `Storage` its creator was given for the chief's directory (an
``s3://`` logdir's client with the front door's ``storage_options``). The decision travels
through `supervisor.distributed.restore` (the store key, the JSON decision, the state
broadcast), which knows no checkpoint format; loading and verifying are `supervisor.checkpoint`'s.

Read once per job (issue 31): the chief keeps the verified copy of the ``state.pt`` it restored,
posts the checkpoint's manifest with its decision and broadcasts the bytes
(`supervisor.checkpoint.load.shared_copy`); every other rank receives them into a private copy of
its own, checked against that manifest, and loads from it — no other rank reads the checkpoint
from storage. A decision without a manifest (an older chief) is restored from storage as before.
"""
from __future__ import annotations

import logging
from typing import Any

from supervisor.distributed import env
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.layout.format import STATE_FILE
from supervisor.checkpoint.load.loader import LoadedCheckpoint, load_state_copy, load_verified
from supervisor.checkpoint.load.apply import apply_checkpoint
from supervisor.checkpoint.load.shared_copy import receive_copy, share_copy
from supervisor.checkpoint.storage import Storage, split_scheme
from supervisor.clock import Clock
from supervisor.distributed.restore import (
    RestoreDecision,
    await_decision,
    broadcast_initial_state,
    next_key,
    publish_decision,
    publish_failure,
    receive_initial_state,
)
from supervisor.state import TrainingState

__all__ = ["decide_as_chief", "initialise_as_chief", "follow_chief"]

logger = logging.getLogger(__name__)


def decide_as_chief(restore: Any, *, initialises: bool = False) -> tuple[Any, str | None]:
    """Runs the chief's ``restore()`` (returns a `Restored` or None) and, in a distributed job,
    posts the outcome for the other ranks — also when it raises, so they fail at once with the
    chief's reason instead of waiting ``max_wait_secs``.

    Returns ``(restored, key)``: ``key`` is not None when nothing was restored and the chief
    ``initialises`` (has an ``init_fn``): the decision is then `initialise_as_chief`'s to post.
    """
    if not env.is_distributed():
        return restore(), None
    key = next_key()
    try:
        restored = restore()
    except BaseException as e:  # the others name it (and the chief's rank) instead of waiting or losing the store
        publish_failure(key, f"{type(e).__name__} on the chief (rank {env.rank()}): {e}")
        raise
    if restored is None and initialises:
        return None, key
    if restored is None:
        publish_decision(key, RestoreDecision())
        return None, None
    kept = getattr(restored, "source", None)  # a duck-typed manager's Restored may have none
    publish_decision(key, RestoreDecision(restored.path, int(restored.global_step),
                                          manifest=kept.manifest.to_json() if kept is not None else None))
    if kept is not None:
        try:
            share_copy(kept.copy, where=f"{restored.path.rstrip('/')}/{STATE_FILE}")
        finally:
            kept.close()
        logger.info("sent the %d bytes of %s to every rank (read once from storage)", kept.copy.size, restored.path)
    return restored, None


def initialise_as_chief(key: str, init: Any, state: TrainingState) -> None:
    """The chief starts from scratch: runs ``init()`` (the user's ``init_fn``), posts the
    decision for ``key`` (or ``init``'s error, then re-raises it) and broadcasts its state."""
    try:
        init()
    except BaseException as e:
        publish_failure(key, f"init_fn failed on the chief (rank {env.rank()}): {type(e).__name__}: {e}")
        raise
    publish_decision(key, RestoreDecision(source=env.rank()))
    broadcast_initial_state(state)


def follow_chief(state: Any, *, max_wait_secs: float, verify: str = "full", unpickling: Unpickling = Unpickling(),
                 save_rng: bool = True, clock: Clock | None = None, storage: Storage | None = None) -> Any:
    """A non-chief rank's restore: waits for the chief's decision and restores exactly that
    checkpoint (verified again here); returns a `Restored`, or None when the chief started
    from scratch (after receiving the chief's state when the chief ran an ``init_fn``; this
    rank runs none). ``storage``: what this rank reads the chief's directory through (its
    client options); a decision on another scheme is read through the storage its path names.
    ``unpickling``: the creator's allow-list (one record, `Unpickling`).

    Raises:
        TimeoutError: no decision within ``max_wait_secs``.
        RuntimeError: the chief failed to restore (its error is quoted).
    """
    decision = await_decision(next_key(), max_wait_secs=max_wait_secs, clock=clock)
    if decision.error is not None:
        raise RuntimeError(f"rank {env.rank()} cannot restore: the chief's restore failed with "
                           f"{decision.error}")
    if decision.path is None:
        if decision.source is not None:
            receive_initial_state(state, decision.source)
        else:
            logger.info("the chief starts from scratch (no init_fn); so does rank %d", env.rank())
        return None
    if decision.manifest is not None:  # the chief sends the bytes it read: none read here
        loaded = _receive(decision.path, decision.manifest, verify=verify, unpickling=unpickling)
    else:
        loaded = load_verified(decision.path, verify=verify, unpickling=unpickling, mmap=True,
                               storage=_storage_of(decision.path, storage))
    if loaded.step != decision.step:
        raise RuntimeError(f"{decision.path} holds step {loaded.step}, the chief restored step {decision.step}")
    return apply_checkpoint(loaded, state, restore_rng=save_rng)


def _storage_of(path: str, storage: Storage | None) -> Storage | None:
    """``storage`` when it serves ``path``'s scheme, else None (the one the path names)."""
    if storage is None or storage.scheme != split_scheme(path)[0]:
        return None
    return storage


def _receive(path: str, manifest_text: str, *, verify: str, unpickling: Unpickling) -> LoadedCheckpoint:
    """The chosen checkpoint's ``state.pt`` as the chief broadcasts it, checked against the
    manifest it posted, loaded (mapped) from this rank's private copy."""
    manifest, copy = receive_copy(path, manifest_text, verify=verify)
    mapped = copy.path is not None
    payload = load_state_copy(path, manifest, copy, unpickling.at("cpu"), mmap=True)
    logger.info("rank %d received %s (%d bytes) from the chief", env.rank(), path, copy.size)
    return LoadedCheckpoint(path, manifest.step, manifest, payload, mapped=mapped)
