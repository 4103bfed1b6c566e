"""Peer replicas of the sharded local tier (SPEC §17, issue 33): ``peer_replicas=True``.

With ``checkpoint_format="dcp"`` and a ``local_dir`` each rank keeps its own part in its node's
local tier (`supervisor.checkpoint.tiers.sharded`); a lost node takes its ranks' parts with it and
the job falls back to the logdir's newest copy. With ``peer_replicas=True`` every rank ``r`` also
keeps a replica of the parts of rank ``(r - n) % W`` (``n`` = ``LOCAL_WORLD_SIZE``, the ranks of a
node: its partner on the previous node), and sends its own to rank ``(r + n) % W`` (the next
node), so one lost node still restores from the local tiers::

    <local_dir>/rank-2/model.ckpt-40/   # rank 2's own part (node 1)
    <local_dir>/peer-0/model.ckpt-40/   # rank 0's part, replicated here (node 0's partner)
    <local_dir>/peer-0/model.ckpt-40.all-ranks

1. **Replicate** (a thread of its own per rank, over a gloo group of its own — never the training
   group; the training step does not wait for it): when the chief commits a step it also says
   whether the step is replicated (unless one replica is in flight and another waits: they never
   pile up), and
   every rank then sends its marked part to its partner while receiving its source's
   (`peer_link.exchange_part`). The receiver commits it with the local protocol (CRC-32 while
   written, compared with the sender's manifest; fsync; manifest last; rename) and writes the same
   ``.all-ranks`` mark: a replica cut by a kill is a ``.tmp-`` directory, never counted. Retention:
   the newest ``local_max_to_keep`` replicas; local retention keeps a part while it is sent.
2. **Agree** (`restore`): as without replicas (`sharded_agree.agree_step`: one all-reduce of a
   4-integer record per round), except that what rank ``q`` proposes stands for its source ``s``:
   ``s`` sends ``q`` its own proposal (one integer, point to point) and ``q`` proposes the newer of
   that and its replica of ``s``'s parts (each verified lazily, in full) — so the agreed step is the
   newest one every rank can restore from its own node or its partner's, O(1) per rank per round.
3. **Fetch**: a rank without its own verified part of the agreed step receives its partner's
   replica (verified on arrival, committed into its own ``rank-<r>/``) before the load; when a
   fetch fails on any rank the job restores the logdir's newest, in a WARNING. Then every rank
   loads its own part alone, bit-exact, and the INFO line says how many ranks used a replica.

One node (``WORLD_SIZE == LOCAL_WORLD_SIZE``) has no partner: a WARNING and no replicas (the job
runs unchanged). ``restore_step=``: a rank without its own verified part of the step fetches its
partner's replica of it as in 3, when every rank has one or the other (else the logdir's copy, as
without replicas); newer replicas lose their mark as newer own parts do. Cost and figures: docs/tiers.md ("Peer replicas"), ``benchmarks/peers.py``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

import torch

from supervisor.checkpoint.arguments import resolve_directory
from supervisor.checkpoint.layout.format import checkpoint_name, step_of
from supervisor.checkpoint.load.choose import chosen_path
from supervisor.checkpoint.sharded import commit as dcp_commit
from supervisor.checkpoint.sharded.manager import ShardedCheckpointManager
from supervisor.checkpoint.tiers import sharded
from supervisor.checkpoint.tiers import sharded_parts as parts
from supervisor.checkpoint.tiers.options import check_peer_replicas
from supervisor.checkpoint.tiers.peer_link import Link, exchange_part
from supervisor.checkpoint.tiers.sharded_agree import agree_step, lowest_lacking

__all__ = ["PeerReplicatedCheckpointManager", "make_sharded_manager", "partners", "ranks_per_node"]

logger = logging.getLogger(__name__)


def make_sharded_manager(directory: Any, *, peer_replicas: bool = False, local_dir: str | None = None,
                         persist_every_steps: int | None = None, persist_every_secs: float | None = None,
                         local_max_to_keep: int | None = 2, persist_grace_secs: float | None = 120.0,
                         basename: str = "model.ckpt", max_to_keep: int | None = 5,
                         keep_checkpoint_every_n_hours: float | None = 10000.0, save_mode: str = "async",
                         trusted_globals: Any = (), max_wait_secs: float = 7200, clock: Any = None,
                         capture: str = "auto", lock: str = "auto",
                         lease_secs: float | None = None) -> ShardedCheckpointManager:
    """The front doors' one call for ``checkpoint_format="dcp"`` (their `CheckpointOptions`; every
    keyword is the managers' own, passed on by name): a `PeerReplicatedCheckpointManager` with
    ``peer_replicas=True``, a `ShardedTieredCheckpointManager` with a ``local_dir``, else a
    `ShardedCheckpointManager`."""
    replicated = check_peer_replicas(peer_replicas, local_dir=local_dir, checkpoint_format="dcp")
    if local_dir is None:
        return ShardedCheckpointManager(
            directory, basename=basename, max_to_keep=max_to_keep, save_mode=save_mode, lock=lock,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, trusted_globals=trusted_globals,
            max_wait_secs=max_wait_secs, clock=clock, capture=capture, lease_secs=lease_secs)
    return (PeerReplicatedCheckpointManager if replicated else sharded.ShardedTieredCheckpointManager)(
        directory, local_dir=local_dir, persist_every_steps=persist_every_steps, persist_every_secs=persist_every_secs,
        local_max_to_keep=local_max_to_keep, persist_grace_secs=persist_grace_secs, basename=basename,
        max_to_keep=max_to_keep, save_mode=save_mode, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        trusted_globals=trusted_globals, max_wait_secs=max_wait_secs, clock=clock, capture=capture, lock=lock,
        lease_secs=lease_secs)


def ranks_per_node(world_size: int, environ: Mapping[str, str] = os.environ) -> int | None:
    """The ranks of a node (``LOCAL_WORLD_SIZE``, which torchrun sets); None when the job has one
    node (no partner: replicas off). `ValueError` when it is unset or does not divide the world."""
    if world_size <= 1:
        return None
    value = environ.get("LOCAL_WORLD_SIZE")
    if value is None or not value.isdigit() or int(value) < 1:
        raise ValueError(f"peer_replicas=True needs LOCAL_WORLD_SIZE (the ranks of one node, which torchrun sets) to "
                         f"find each rank's partner on another node, got {value!r}; start the job with torchrun, set "
                         "LOCAL_WORLD_SIZE, or drop peer_replicas")
    per_node = int(value)
    if world_size % per_node:
        raise ValueError(f"peer_replicas=True needs nodes of equal size: WORLD_SIZE={world_size} is not a multiple of "
                         f"LOCAL_WORLD_SIZE={per_node}; run the same number of ranks on every node or drop peer_replicas")
    return per_node if per_node < world_size else None


def partners(rank: int, world_size: int, per_node: int) -> tuple[int, int]:
    """(the rank that keeps ``rank``'s replicas, the rank whose replicas ``rank`` keeps): one node on, one back."""
    return (rank + per_node) % world_size, (rank - per_node) % world_size


class _Parts:
    """One directory of committed parts (a rank's own, or its replicas of its source's), verified lazily."""

    def __init__(self, root: str, manager: PeerReplicatedCheckpointManager) -> None:
        self.root, self._manager = root, manager
        self.steps = parts.committed_steps(root, manager.basename)
        self._checked: dict[int, bool] = {}

    def propose(self, candidate: int | None) -> int:
        """The newest step not newer than ``candidate`` whose part verifies in full; -1: none."""
        m = self._manager
        for step in self.steps:
            if candidate is not None and step > candidate:
                continue
            if step not in self._checked:
                self._checked[step] = parts.verified_part(self.root, m.basename, step, m.local_storage,
                                                          world_size=m.world_size, verify=m.verify) is not None
            if self._checked[step]:
                return step
        return -1


class PeerReplicatedCheckpointManager(sharded.ShardedTieredCheckpointManager):
    """`ShardedTieredCheckpointManager` whose ranks also keep a replica of a partner node's parts
    (module docstring); one on every rank. Takes `ShardedTieredCheckpointManager`'s arguments;
    ``replicas``: (step, bytes sent, seconds) of each replication this session made (the figures)."""

    def __init__(self, directory: Any, *, local_dir: Any, persist_every_steps: int | None = None,
                 persist_every_secs: float | None = None, local_max_to_keep: int | None = 2,
                 persist_grace_secs: float | None = 120.0, max_consecutive_save_failures: int | None = None,
                 basename: str = "model.ckpt", max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = 10000.0, save_mode: str = "async", verify: str = "full",
                 save_rng: bool = True, trusted_globals: Any = (), max_wait_secs: float = 7200,
                 save_timeout_secs: float = 1800.0, clock: Any = None, capture: str = "auto", copier: Any = None,
                 lock: str = "auto", lease_secs: float | None = None, storage_options: Any = None) -> None:
        per_node = ranks_per_node(dcp_commit.rank_and_size()[1])  # refused before anything starts
        super().__init__(
            resolve_directory(directory, storage_options), local_dir=local_dir, persist_every_steps=persist_every_steps, persist_every_secs=persist_every_secs,
            local_max_to_keep=local_max_to_keep, persist_grace_secs=persist_grace_secs, basename=basename,
            max_consecutive_save_failures=max_consecutive_save_failures, max_to_keep=max_to_keep, save_mode=save_mode,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, verify=verify, save_rng=save_rng,
            trusted_globals=trusted_globals, max_wait_secs=max_wait_secs, save_timeout_secs=save_timeout_secs,
            clock=clock, capture=capture, copier=copier, lock=lock, lease_secs=lease_secs)
        self.world_size = self._world
        self.holder: int | None = None
        self.source: int | None = None
        if per_node is None:
            if self._rank == 0:
                logger.warning("peer_replicas=True: this job runs on one node (WORLD_SIZE=%d, LOCAL_WORLD_SIZE=%s), "
                               "there is no other node to keep replicas: none are kept", self._world,
                               os.environ.get("LOCAL_WORLD_SIZE"))
        else:
            self.holder, self.source = partners(self._rank, self._world, per_node)
        self.replica_root = os.path.join(self.local_dir, f"peer-{self.source}") if self.source is not None else None
        self.replicas: list[tuple[int, int, float]] = []
        self._peer_group: Any = None
        self._replicator: parts.CopyQueue | None = None
        self._broken = False

    def open(self) -> None:
        super().open()
        if self.replica_root is None:
            return
        if self._peer_group is None:
            self._peer_group = dcp_commit.side_group(self.save_timeout_secs)  # every rank, the same point
        self.local_storage.makedirs(self.replica_root)
        parts.prune_parts(self.replica_root, self.basename, keep=None)  # a replica cut by a kill
        if self._replicator is None:
            self._replicator = parts.CopyQueue(self._replicate)

    # ---------------------------------------------------------------- replicating
    def _verdict(self, error: str, step: int) -> dict:
        verdict = super()._verdict(error, step)
        verdict["peer"] = bool(not error and self._replicator is not None and len(self._replicator.held()) < 2
                               and not self._broken)  # one in flight, one waiting at most
        return verdict

    def _marked(self, step: int, key: str, path: str, verdict: dict) -> None:
        super()._marked(step, key, path, verdict)
        if verdict.get("peer") and self._replicator is not None:
            self._replicator.enqueue(step, key, path)

    def _held(self) -> set[int]:
        return super()._held() | (self._replicator.held() if self._replicator is not None else set())

    def wait_replicas(self, timeout_secs: float | None = None) -> bool:
        """Waits for the replications queued so far (their exchanges end on both sides); False when
        ``timeout_secs`` ran out first."""
        return self._replicator.flush(timeout_secs) if self._replicator is not None else True

    def _replicate(self, step: int, key: str, path: str) -> None:
        """This rank's part of replicating ``step`` (module docstring, 1), on its replication thread."""
        if self._broken:
            return
        link, start = Link(self._peer_group, self.holder, self.source), time.perf_counter()
        try:
            exchange_part(link, path, self.local_storage, root=self.replica_root,  # type: ignore[arg-type]
                          name=checkpoint_name(self.basename, step), mark=parts.mark_committed)
        except Exception as e:  # noqa: BLE001 - a partner gone: the replicas stop, the training does not
            self._broken = True
            logger.warning("peer replicas stop for this session: replicating step %d with ranks %s and %s failed: %s: "
                           "%s", step, self.holder, self.source, type(e).__name__, e)
            return
        self.replicas.append((step, link.sent, time.perf_counter() - start))
        parts.prune_parts(self.replica_root, self.basename, keep=self.local_max_to_keep)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- restoring
    def restore(self, state: Any, step: Any = None) -> Any:
        """The newest step every rank restores from its own node or its partner's (module
        docstring, 2-3), when it is at least the logdir's newest; else the logdir's, as plain ``dcp``."""
        if step is not None or self._peer_group is None:
            return super().restore(state, step)
        self._settle()
        self._writer.wait()
        own, mine = _Parts(self.part_root, self), _Parts(self.replica_root, self)  # type: ignore[arg-type]
        link = Link(self._peer_group, self.holder, self.source)
        persistent = self._scheduled[0] if self._inner is not None and self._scheduled[0] is not None else -1
        agreed, newest, persistent, empty, rounds = agree_step(
            lambda c: max(link.swap_int(own.propose(c)), mine.propose(c)), newest=own.steps[0] if own.steps else -1,
            persistent=persistent, empty_rank=-1 if own.steps else self._rank)
        logger.debug("the ranks agreed on local step %d (own parts or replicas) in %d round(s)", agreed, rounds)
        fetched = self._fetch(agreed, own) if agreed >= 0 and agreed >= persistent else None
        if fetched is not None:
            why = ("the logdir has no checkpoint yet" if persistent < 0 else f"newer than the logdir's step {persistent}"
                   if agreed > persistent else "the logdir holds the same step")
            if fetched:
                why += f"; {fetched} rank(s) without their own part restored their peer's replica (peer_replicas)"
            restored = self._restore_local(state, agreed, why)
        else:
            restored = ShardedCheckpointManager.restore(self, state)
            self._say_fallback(restored, newest, empty)
        newer_than = restored.global_step if restored is not None else -1
        for root in (self.part_root, self.replica_root):
            parts.prune_parts(root, self.basename, keep=self.local_max_to_keep, newer_than=newer_than)  # type: ignore[arg-type]
        return restored

    def _restore_chosen(self, state: Any, chosen: Any) -> Any:
        """``restore_step=``: the ranks lacking their own verified part of the step fetch their
        partner's replica of it when every rank has one or the other (one integer to the holder, one
        all-reduce), then `ShardedTieredCheckpointManager._restore_chosen` (every rank's own part,
        else the logdir's); the replicas of newer steps lose their mark (an abandoned timeline)."""
        step = step_of(self.storage.basename(chosen_path(self.directory, self.basename, chosen, self.storage)),
                       self.basename)
        if self._peer_group is None or step is None:
            return super()._restore_chosen(state, chosen)
        own, mine = _Parts(self.part_root, self), _Parts(self.replica_root, self)  # type: ignore[arg-type]
        source_holds = Link(self._peer_group, self.holder, self.source).swap_int(int(own.propose(step) == step))
        if lowest_lacking(bool(source_holds) or mine.propose(step) == step) < 0:
            fetched = self._fetch(step, own)
            if fetched and self._rank == 0:
                logger.info("restore_step: %d rank(s) without their own part restored their peer's replica of step %d "
                            "(peer_replicas)", fetched, step)
        restored = super()._restore_chosen(state, chosen)
        newer = [s for s in parts.committed_steps(self.replica_root, self.basename) if s > step]  # type: ignore[arg-type]
        for old in newer:
            parts.unmark(os.path.join(self.replica_root, checkpoint_name(self.basename, old)))  # type: ignore[arg-type]
        if newer:
            logger.warning("restore_step=%d: the peer replicas of the newer step(s) %s in %s are no longer restored "
                           "(marks removed; each is replaced when the run replicates its step again)", step,
                           ", ".join(map(str, sorted(newer))), self.replica_root)
        return restored

    def _fetch(self, step: int, own: _Parts) -> int | None:
        """Each rank without its own verified part of ``step`` receives its partner's replica into
        its own tier; returns how many ranks did, or None when one failed (every rank alike)."""
        name = checkpoint_name(self.basename, step)
        need = own.propose(step) != step
        source_needs = Link(self._peer_group, self.holder, self.source).swap_int(int(need)) == 1
        back = Link(self._peer_group, self.source if source_needs else None, self.holder if need else None)
        replica = os.path.join(self.replica_root, name) if source_needs else None  # type: ignore[arg-type]
        if need:  # a damaged part of its own is replaced by the replica
            parts.remove_part(os.path.join(self.part_root, name))
        try:
            got = exchange_part(back, replica, self.local_storage, root=self.part_root, name=name,
                                mark=parts.mark_committed)
        except Exception as e:  # noqa: BLE001 - a partner gone: the job restores the logdir
            logger.warning("fetching the replica of step %d from rank %s failed: %s: %s", step, self.holder,
                           type(e).__name__, e)
            got = None
        failed, fetched = self._sum([int(need and got is None), int(need)])
        return None if failed else fetched

    def _sum(self, values: list[int]) -> list[int]:
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._peer_group)
        return [int(v) for v in tensor.tolist()]

    # ---------------------------------------------------------------- closing
    def close(self, *, failed: bool = False) -> None:
        """Finishes the replications queued (within ``persist_grace_secs``; after an error within 5 s
        at most), then closes as `ShardedTieredCheckpointManager`. Idempotent."""
        if not self._closed and self._replicator is not None:
            if not failed:
                self._settle()
                self._writer.wait()  # the last local commit, which may be replicated
            # after an error too, briefly: a partner may be in the same exchange (it would wait for this rank)
            self.wait_replicas(min(5.0, self.persist_grace_secs or 5.0) if failed else self.persist_grace_secs)
            self._replicator.stop()
            self._replicator = None
        super().close(failed=failed)
