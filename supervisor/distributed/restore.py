"""Restore decided once (SPEC §4, §12): the chief chooses, every rank restores exactly that.

At every session creation the chief chooses the checkpoint as a single process would (the
index's choice, verified, falling back to older ones, §5.4), restores it, and posts its decision
— path and step, "start from scratch", or the error that stopped it — under one key of the
process group's store. Every other rank waits for that key (polling at most every second, for at
most ``max_wait_secs``), then restores exactly that path: never its own directory listing, so
ranks cannot diverge when a checkpoint commits meanwhile. A rank that gives up raises
`TimeoutError` naming the key, the chief and the time waited.

Starting from scratch, only the chief runs ``init_fn`` (SPEC §4: non-chief ranks do not
initialise). It posts its decision after ``init_fn`` returned — or with ``init_fn``'s error,
which every rank then raises — and broadcasts its state (every entry but the data loaders, which
keep each rank's own position; tensors sent from the CPU, one ``broadcast_object_list`` on the
default group); the others load it before their first step. So a randomised or file-reading
``init_fn`` can never split the ranks, and the wait for it is bounded by ``max_wait_secs``.

Restoring a ``state.pt`` checkpoint, only the chief reads it from storage (read once per job,
issue 31): its decision carries the checkpoint's manifest, and `broadcast_bytes` then sends the
verified bytes it read to every rank over the default group, in chunks of at most
`CHUNK_BYTES` (uint8 tensors: on the CPU under gloo, through the current CUDA device under
NCCL). Every other rank writes them into a private copy of its own, checksums them on the way
and checks them against that manifest (`supervisor.creators.chief_choice`). Storage bytes read
per restore: the checkpoint's size once, at any world size; memory on a receiving rank: the
checkpoint plus one chunk.

This module is the decision's channel (`RestoreDecision` under a store key), the state
broadcast and the byte broadcast; the creators' policy on top of it is
`supervisor.creators.chief_choice`.

Keys are ``supervisor/restore/<agreed round>/<creation number>`` (`env.agreed_key`): every rank
creates its sessions in the same order, so the n-th creation of each rank in a process group
reads the chief's n-th decision (numbered by the group, not by the process: issue 32).
"""
from __future__ import annotations

import json
from collections import OrderedDict
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from supervisor.distributed import env
from supervisor.clock import Clock, resolve_clock
from supervisor.state.resume import stateful_loaders
from supervisor.state import TrainingState, unwrap_module

__all__ = ["CHUNK_BYTES", "FAILURE_READ_SECS", "RestoreDecision", "next_key", "publish_decision", "publish_failure",
           "await_decision",
           "broadcast_initial_state", "receive_initial_state", "broadcast_bytes", "all_reduce_max"]

logger = logging.getLogger(__name__)

POLL_SECS = 0.2  # how often a waiting rank looks (SPEC: at least once a second)
CHUNK_BYTES = 64 << 20  # the largest piece of a checkpoint in flight at once (`broadcast_bytes`)
#: How long a chief that failed waits for the other ranks to read its error (`publish_failure`).
FAILURE_READ_SECS = 30.0


@dataclass(frozen=True)
class RestoreDecision:
    """The chief's restore decision: a checkpoint (``path``, ``step``), scratch (both None), or
    the chief's ``error``. ``source``: from scratch, the rank whose state (after its
    ``init_fn``) is broadcast to every rank; None when nothing is broadcast. ``manifest``: the
    chosen checkpoint's ``MANIFEST.json`` text when the chief broadcasts the checkpoint's bytes
    (`broadcast_bytes`) instead of every rank reading them from storage; None (a decision of an
    older chief, or a sharded checkpoint): each rank reads its part itself. ``shared``: for a
    sharded checkpoint, how many bytes of replicated items the chief sends after ``.metadata``
    (`supervisor.checkpoint.formats.dcp_replicated`); None or 0: none."""

    path: str | None = None
    step: int | None = None
    error: str | None = None
    source: int | None = None
    manifest: str | None = None
    shared: int | None = None

    def to_json(self) -> str:
        return json.dumps({"path": self.path, "step": self.step, "error": self.error, "source": self.source,
                           "manifest": self.manifest, "shared": self.shared})

    @classmethod
    def from_json(cls, text: str) -> RestoreDecision:
        data = json.loads(text)
        return cls(data["path"], data["step"], data["error"], data.get("source"), data.get("manifest"),
                   data.get("shared"))


def next_key() -> str:
    """The store key of this process's next session creation (call once per creation)."""
    return env.agreed_key("restore")


def publish_decision(key: str, decision: RestoreDecision, store: Any = None) -> None:
    """The chief posts its decision for the creation ``key``."""
    (store or env.default_store()).set(key, decision.to_json())
    logger.debug("posted the restore decision %s under %s", decision, key)


def publish_failure(key: str, error: str, *, store: Any = None, clock: Clock | None = None,
                    wait_secs: float = FAILURE_READ_SECS) -> None:
    """The chief posts the ``error`` that stopped its restore (or ``init_fn``) for the creation
    ``key``, then waits until every other rank has read it (`await_decision` counts the reads
    under ``<key>/read``), at most ``wait_secs``: under ``env://`` the store lives in the chief's
    process, and a chief that raised at once took it along before the others looked, so they said
    they lost the store instead of naming the chief's error. Never raises (the caller raises the
    chief's own error next); a rank that has not read it by then is named in a WARNING."""
    store = store or env.default_store()
    clock = resolve_clock(clock)
    others, deadline = env.world_size() - 1, clock.monotonic() + wait_secs
    try:
        publish_decision(key, RestoreDecision(error=error), store)
        while (read := int(store.add(f"{key}/read", 0))) < others:
            if clock.monotonic() >= deadline:
                logger.warning("%d of the %d other rank(s) did not read the chief's failure within %g s (store key "
                               "%r); they may report a lost store instead", others - read, others, wait_secs, key)
                return
            clock.sleep(0.05)
    except (RuntimeError, OSError) as e:  # the store is gone: nothing more to tell anyone
        logger.warning("could not post the chief's failure for the other ranks (store key %r): %s", key, e)


def await_decision(key: str, *, max_wait_secs: float, store: Any = None, clock: Clock | None = None) -> RestoreDecision:
    """Waits for the chief's decision for ``key``; a failure it reads is counted as read
    (`publish_failure` waits for that).

    Raises:
        TimeoutError: no decision within ``max_wait_secs``; names what it waited for.
    """
    store = store or env.default_store()
    clock = resolve_clock(clock)
    start = last_log = clock.monotonic()
    while True:
        try:
            if store.check([key]):
                value = store.get(key)
                decision = RestoreDecision.from_json(value.decode("utf-8") if isinstance(value, bytes) else value)
                if decision.error is not None:
                    store.add(f"{key}/read", 1)
                return decision
        except (RuntimeError, OSError) as e:  # torch's DistNetworkError/DistStoreError are RuntimeErrors
            raise RuntimeError(
                f"rank {env.rank()} lost the process group's store while waiting for the chief's "
                f"restore decision (store key {key!r}): its host is gone — the chief (rank 0) under env://, "
                "torchrun's agent under torchrun; the chief's own error says why") from e
        now = clock.monotonic()
        waited = now - start
        if waited >= max_wait_secs:
            raise TimeoutError(
                f"rank {env.rank()} waited {waited:.0f} s (max_wait_secs={max_wait_secs:g}) for the "
                f"chief's restore decision (store key {key!r}); the chief (rank 0) has not restored or "
                "initialised its state yet. Check that it is running and not stuck, or raise max_wait_secs")
        if now - last_log >= 30:
            logger.info("rank %d still waiting for the chief's restore decision (%.0f s)", env.rank(), waited)
            last_log = now
        clock.sleep(min(POLL_SECS, max_wait_secs - waited))


def broadcast_initial_state(state: TrainingState) -> None:
    """The chief sends its state after ``init_fn`` to every rank (`receive_initial_state`):
    one ``broadcast_object_list`` on the default group."""
    import torch.distributed as dist

    dist.broadcast_object_list([_shared_state(state)], src=env.rank())
    logger.info("sent the state after init_fn to every rank")


def _shared_state(state: TrainingState) -> dict[str, Any]:
    """What the chief sends after ``init_fn``: every entry's state dict but the data loaders'
    (each rank keeps its own position), tensors on the CPU (each rank loads onto its devices)."""
    loaders = {name for name, _ in stateful_loaders(state)}
    return {name: _to_cpu(unwrap_module(obj).state_dict()) for name, obj in state.items() if name not in loaders}


def _to_cpu(value: Any) -> Any:
    """``value`` with its tensors on the CPU (dicts, lists and tuples walked; the rest as is)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if type(value) in (dict, OrderedDict):
        return type(value)((k, _to_cpu(v)) for k, v in value.items())
    if type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def receive_initial_state(state: TrainingState, source: int) -> None:
    """A non-chief rank loads the state the chief broadcast after its ``init_fn``."""
    import torch.distributed as dist

    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=source)
    TrainingState({name: state[name] for name in box[0]}).load_state_dict(box[0])
    logger.info("rank %d starts from the state of rank %d after its init_fn", env.rank(), source)


def broadcast_bytes(size: int, *, src: int, fill: Callable[[int, memoryview], None] | None = None,
                    drain: Callable[[int, memoryview], None] | None = None, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Sends ``size`` bytes from rank ``src`` to every rank of the default group, in chunks of at
    most ``chunk_bytes``: one ``broadcast`` of a uint8 tensor each, on the CPU under gloo, through
    the current CUDA device under NCCL. On ``src``, ``fill(offset, view)`` puts the bytes at
    ``offset`` into ``view``; on every other rank ``drain(offset, view)`` takes them (the view is
    reused for the next chunk). A collective: every rank calls it with the same ``size``.
    Memory: one chunk on the host (pinned under NCCL) and one on the device."""
    import torch.distributed as dist

    if size <= 0:
        return
    sending = env.rank() == src
    device = _chunk_device(dist.get_backend())
    host = torch.empty(min(size, chunk_bytes), dtype=torch.uint8, pin_memory=device.type == "cuda")
    wire = host if device.type == "cpu" else torch.empty(host.numel(), dtype=torch.uint8, device=device)
    view = memoryview(host.numpy()).cast("B")
    for offset in range(0, size, chunk_bytes):
        n = min(chunk_bytes, size - offset)
        if sending:
            fill(offset, view[:n])  # type: ignore[misc]
            if wire is not host:
                wire[:n].copy_(host[:n])
        dist.broadcast(wire[:n], src=src)
        if not sending:
            if wire is not host:
                host[:n].copy_(wire[:n])  # waits for the broadcast on the current stream
            drain(offset, view[:n])  # type: ignore[misc]
    logger.debug("broadcast %d bytes from rank %d in %d chunk(s) over %s", size, src,
                 -(-size // chunk_bytes), device)


def _chunk_device(backend: str) -> torch.device:
    """Where a chunk travels: NCCL moves device memory only (the current CUDA device), gloo the CPU's."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_max(value: int) -> int:
    """The largest of every rank's ``value`` (one all-reduce of one int64 on the default group,
    on the current CUDA device under NCCL): how the ranks agree on a restore's outcome."""
    import torch.distributed as dist

    tensor = torch.tensor([int(value)], dtype=torch.int64, device=_chunk_device(dist.get_backend()))
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
