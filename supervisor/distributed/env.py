"""Where this process stands in a distributed job (the foundation floor of `supervisor.distributed`):
its rank, the world size, torchrun's restart count, the default group's store, and joining and
leaving the default process group. It imports nothing of this project, so every floor may use it
(the checkpoint package reads the rank and world size here)."""
from __future__ import annotations

import datetime
import logging
import os
import weakref
from typing import Any

__all__ = ["rank", "world_size", "default_is_chief", "is_initialized", "is_distributed", "attempt",
           "agree_round", "agreed_key", "init_process_group", "destroy_process_group", "default_store"]

logger = logging.getLogger(__name__)


def is_initialized() -> bool:
    """Whether a default ``torch.distributed`` process group is initialised in this process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank: the initialised process group's, else torchrun's ``RANK``, else 0."""
    if is_initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    """The number of ranks: the process group's, else torchrun's ``WORLD_SIZE``, else 1."""
    if is_initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed() -> bool:
    """Whether ranks must coordinate: an initialised process group of more than one rank."""
    return is_initialized() and world_size() > 1


def default_is_chief(is_chief: bool | None) -> bool:
    """``is_chief`` when given, else whether this process is rank 0."""
    return rank() == 0 if is_chief is None else is_chief


_ROUND: list[int] = []  # the rendezvous round agreed at init_process_group (one per process)


def attempt() -> int:
    """What namespaces this job's keys in the store (the process group's prefix, the restore and
    agreement keys): the round every rank of this rendezvous agreed on in `init_process_group`
    under torchrun's agent store (issue 31.4: the same on a replaced node, whose agent's restart
    count starts again at 0); else torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``),
    0 outside torchrun."""
    if _ROUND:
        return _ROUND[0]
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


# The numbers `agreed_key` hands out: [the default group they count for (a weak reference, None
# without one), {purpose: the next number}]; a new default group starts every count again at 0.
_SEQUENCES: list[Any] = [None, {}]


def agreed_key(purpose: str) -> str:
    """The store key of this process's next ``purpose`` (a session creation's restore decision,
    an agreement's side store, a sharded save): ``supervisor/<purpose>/<attempt()>/<n>``.

    ``n`` counts the ``purpose`` keys asked for in the current default process group, on every
    rank in the same order (they are collectives), starting at 0 with each group, so every rank
    of one rendezvous names the same keys even when one of them created more sessions, agreements
    or saves before it joined this group (issue 32: a process-global counter would not). Keys are
    namespaced by the round every rank of the rendezvous agreed on (`attempt`); without a
    process group (nothing to agree with) the numbers count for this process.
    """
    group = _default_group()
    held = _SEQUENCES[0]() if _SEQUENCES[0] is not None else None
    if held is not group:
        _SEQUENCES[:] = [weakref.ref(group) if group is not None else None, {}]
    counts = _SEQUENCES[1]
    number = counts.get(purpose, 0)
    counts[purpose] = number + 1
    return f"supervisor/{purpose}/{attempt()}/{number}"


def _default_group() -> Any:
    if not is_initialized():
        return None
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_group()


def agree_round(store: Any, rank: int, world_size: int, *, timeout_secs: float, poll_secs: float = 0.05) -> int:
    """The round number every rank of this rendezvous agrees on, through ``store`` (torchrun's
    agent store, which outlives the workers of a round): rank 0 draws the next number
    (``add``) and answers each rank's hello; hellos are per-rank nonces, so a key left by a round
    whose workers are gone is never taken for this round's. Rank 0 makes O(world_size) requests a
    poll until every rank acknowledged; every other rank O(1). Assumes, as torchrun guarantees,
    that no worker of an earlier round still runs (its agent stopped them before re-rendezvous).

    Raises TimeoutError naming the ranks not heard from after ``timeout_secs``."""
    import time
    import uuid

    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"supervisor/round/hello/{rank}", nonce)
        store.wait([f"supervisor/round/welcome/{rank}/{nonce}"], datetime.timedelta(seconds=timeout_secs))
        agreed = int(store.get(f"supervisor/round/welcome/{rank}/{nonce}"))
        store.set(f"supervisor/round/{agreed}/ack/{rank}", nonce)
        return agreed
    agreed = int(store.add("supervisor/round/counter", 1))
    waiting = set(range(1, world_size))
    deadline = time.monotonic() + timeout_secs
    while waiting:
        for other in sorted(waiting):
            if store.check([f"supervisor/round/{agreed}/ack/{other}"]):
                waiting.discard(other)
            elif store.check([f"supervisor/round/hello/{other}"]):
                nonce = store.get(f"supervisor/round/hello/{other}").decode()
                if nonce:  # answered, then cleared unless it changed meanwhile (a newer hello)
                    store.set(f"supervisor/round/welcome/{other}/{nonce}", str(agreed))
                    store.compare_set(f"supervisor/round/hello/{other}", nonce, "")
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 waited {timeout_secs:g} s (timeout_secs) for ranks {sorted(waiting)} "
                               f"to join rendezvous round {agreed}; check that every rank started")
        if waiting:
            time.sleep(poll_secs)
    return agreed


def default_store() -> Any:
    """The store the default process group rendezvoused on (keys namespaced by the caller)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def init_process_group(backend: str = "gloo", *, timeout_secs: float = 300.0) -> None:
    """Initialises the default process group from torchrun's (or ``env://``'s) environment.

    Under torchrun the group rendezvouses on a ``PrefixStore("round_<n>")`` over the elastic
    agent's store: a plain ``init_process_group`` after an elastic restart can hang or dial the
    dead rank's old address (measured on torch 2.13/gloo: 6 of 8 restarts), while a fresh prefix
    per attempt worked 8 of 8. The round ``n`` is agreed by every rank through the store first
    (`agree_round`), not taken from ``TORCHELASTIC_RESTART_COUNT``, which each node's agent
    counts for itself: a replaced node's ranks would wait on other keys (issue 31.4).
    Otherwise (outside torchrun, or torchrun with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) it is
    ``init_process_group(backend)`` with ``env://``, and the round is agreed on its store after.

    Args:
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPUs).
        timeout_secs: the collective timeout of the default group.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_secs)
    if is_initialized():
        raise RuntimeError("a default process group is already initialised in this process")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                    is_master=False, timeout=timeout)
        rank_, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        _ROUND[:] = [agree_round(agent_store, rank_, world, timeout_secs=timeout_secs)]
        store = dist.PrefixStore(f"supervisor/round_{attempt()}", agent_store)
        dist.init_process_group(backend, store=store, rank=rank_, world_size=world, timeout=timeout)
    else:  # the store is made by rank 0 (fresh each time); the round still replaces the restart count
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        _ROUND[:] = [agree_round(default_store(), rank(), world_size(), timeout_secs=timeout_secs)]
    logger.info("joined the %s process group as rank %d of %d (attempt %s, round %d)", backend, rank(), world_size(),
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), attempt())


def destroy_process_group(*, timeout_secs: float = 60.0) -> None:
    """Leaves the default process group: a bounded barrier (so no rank tears down its
    connections while another still uses them, which occasionally aborted gloo at exit), then
    ``destroy_process_group``. A barrier that fails (a peer is gone) is logged, not raised."""
    import torch.distributed as dist

    if not is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_secs))
        else:
            dist.barrier()
    except Exception as e:  # noqa: BLE001 - leaving anyway
        logger.warning("the barrier before leaving the process group failed: %s", e)
    dist.destroy_process_group()
