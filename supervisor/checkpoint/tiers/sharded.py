"""`ShardedTieredCheckpointManager`: checkpoint tiers for sharded state (SPEC §17, issue 33).

``checkpoint_format="dcp"`` with a ``local_dir``. A save is a collective, as without tiers:

1. every rank commits its own part (shards, RNG states) into its node's local tier with the local
   protocol (`supervisor.checkpoint.tiers.sharded_parts`), then reports to the chief (the store);
2. the chief, once every part is durable (its logdir lease still held), posts the commit and
   whether the step is persisted (``persist_every_steps``/``_secs``, no copy in flight); every
   rank marks its part; a failure on any rank fails the save on every rank (parts removed);
3. a persisted step is copied in the background by every rank's persist thread into a staged
   logdir checkpoint, which the chief seals (merged DCP ``.metadata``, manifest last) only once
   every rank's copy arrived verified: a kill leaves a temp directory, never a listed partial copy.

Restore (`restore`): the ranks agree (`sharded_agree.agree_step`) on the newest step every rank
holds locally; when it is at least the logdir's newest each rank loads its own part (bit-exact),
else the logdir's newest as plain ``dcp``, in a WARNING. ``restore_step=``: `_restore_chosen`.
Peer replicas: `supervisor.checkpoint.tiers.peers`. Design, failure matrix: docs/tiers.md.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from typing import Any

from supervisor import distributed
from supervisor.checkpoint.arguments import resolve_directory
from supervisor.checkpoint.layout.format import FileRecord, checkpoint_name, read_manifest, step_of
from supervisor.checkpoint.layout.verify import DCP_METADATA
from supervisor._validate import check_int
from supervisor.checkpoint.load.choose import candidates, chosen_path
from supervisor.checkpoint.ownership.lease import LeaseLostError
from supervisor.checkpoint.save.failure_policy import ConsecutiveFailures
from supervisor.checkpoint.save.temp import TempCheckpoint
from supervisor.checkpoint.sharded import commit as dcp_commit
from supervisor.checkpoint.sharded.manager import ShardedCheckpointManager
from supervisor.checkpoint.sharded.state_dict import restore_sharded
from supervisor.checkpoint.storage import storage_for
from supervisor.checkpoint.tiers import sharded_parts as parts
from supervisor.checkpoint.tiers.sharded_agree import agree_step, all_reduce_max, fallback_note, lowest_lacking
from supervisor.checkpoint.tiers.options import check_tiers
from supervisor.checkpoint.tiers.persist import is_due
from supervisor.errors import CheckpointError

__all__ = ["ShardedTieredCheckpointManager"]

logger = logging.getLogger(__name__)


class ShardedTieredCheckpointManager(ShardedCheckpointManager):
    """``checkpoint_format="dcp"`` with a node-local tier (module docstring); one on every rank
    (the front doors': `supervisor.checkpoint.tiers.peers.make_sharded_manager`).

    Args:
        directory: the logdir (the persistent tier): a local path, shared filesystem or URL.
        local_dir: the node-local tier (ranks of one node share it: each keeps ``rank-<r>/``).
        persist_every_steps, persist_every_secs, local_max_to_keep, persist_grace_secs: as
            `TieredCheckpointManager` (the chief decides which steps are persisted).
        max_consecutive_save_failures: the copies' save-failure policy, as `TieredCheckpointManager`'s
            (None: the first failed copy is fatal); every rank counts the chief's verdicts alike.
        Every other argument is `ShardedCheckpointManager`'s (the logdir's retention and lock).
    """

    def __init__(self, directory: Any, *, local_dir: Any, persist_every_steps: int | None = None,
                 persist_every_secs: float | None = None, local_max_to_keep: int | None = 2,
                 persist_grace_secs: float | None = 120.0, max_consecutive_save_failures: int | None = None,
                 basename: str = "model.ckpt", max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = 10000.0, save_mode: str = "async", verify: str = "full",
                 save_rng: bool = True, trusted_globals: Any = (), max_wait_secs: float = 7200,
                 save_timeout_secs: float = 1800.0, clock: Any = None, capture: str = "auto", copier: Any = None,
                 lock: str = "auto", lease_secs: float | None = None, storage_options: Any = None) -> None:
        super().__init__(resolve_directory(directory, storage_options), basename=basename, max_to_keep=max_to_keep,
                         keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, save_mode=save_mode, verify=verify,
                         save_rng=save_rng, trusted_globals=trusted_globals, max_wait_secs=max_wait_secs, clock=clock,
                         save_timeout_secs=save_timeout_secs, capture=capture, copier=copier, lock=lock, lease_secs=lease_secs)
        self._copy_failures = ConsecutiveFailures(check_int(
            "max_consecutive_save_failures", max_consecutive_save_failures, minimum=1, allow_none=True))
        tiers = check_tiers(local_dir=local_dir, persist_every_steps=persist_every_steps,
                            persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep,
                            persist_grace_secs=persist_grace_secs, logdir=self.directory)
        self.local_dir, self.persist_grace_secs, self.local_max_to_keep = (
            tiers["local_dir"], tiers["persist_grace_secs"], tiers["local_max_to_keep"])
        self.persist_every_steps, self.persist_every_secs = tiers["persist_every_steps"], tiers["persist_every_secs"]
        self.local_storage = storage_for(self.local_dir)
        self._rank, self._world = dcp_commit.rank_and_size()
        self.part_root = parts.part_root(self.local_dir, self._rank)
        self._scheduled: tuple[int | None, float] = (None, 0.0)  # the chief's last persisted step, time
        self._persister: parts.CopyQueue | None = None
        self._final_abort = threading.Event()

    def open(self) -> None:
        super().open()
        self.local_storage.makedirs(self.part_root)
        parts.prune_parts(self.part_root, self.basename, keep=None)  # a crashed writer's staging leftovers
        if self._inner is not None:
            steps = [s for s in (step_of(self.storage.basename(p), self.basename)
                                 for p in candidates(self.directory, self.basename, self.storage)) if s is not None]
            self._scheduled = (max(steps, default=None), self._clock.time())
        else:  # one request per rank: its client's set-up is paid here, not by its first copy
            self.storage.exists(self.directory)
        if self._persister is None:
            self._persister = parts.CopyQueue(self._persist)

    def _remove_dropped(self) -> None:
        """The logdir's retention runs after each persisted copy (the persist thread), not after a local save."""

    # ---------------------------------------------------------------- the local save
    def _commit(self, save: dcp_commit.ShardedSave, channel: dcp_commit.Channel) -> str:
        """This rank's part of a local save (module docstring, 1-2); returns its part's path."""
        deadline = time.monotonic() + save.timeout_secs
        path = None
        try:
            path = parts.save_part(self.part_root, self.local_storage, name=save.name, step=save.step,
                                   wall_time=save.wall_time, state_dict=save.state_dict, rng=save.rng,
                                   rank=save.rank, world_size=save.world_size)
            mine = {"ok": True, "message": ""}
        except Exception as e:  # noqa: BLE001 - reported to the chief, raised on every rank
            mine = {"ok": False, "message": f"rank {save.rank}: {type(e).__name__}: {e}"}
        try:
            channel.post(f"{save.key}/tier-{save.rank}", mine)
            verdict = (self._decide(save, channel, deadline) if save.rank == 0 else
                       channel.wait(f"{save.key}/tier-verdict", deadline=deadline, what="the chief's commit"))
        except Exception as e:  # noqa: BLE001 - e.g. the store is gone with the chief
            verdict = {"error": f"rank {save.rank}: {type(e).__name__}: {e}", "persist": False}
        if verdict["error"]:
            if path is not None:
                parts.remove_part(path)
            raise CheckpointError(f"saving the sharded checkpoint of step {save.step} to the local tier "
                                  f"{self.part_root} failed: {verdict['error']}")
        parts.mark_committed(path)  # type: ignore[arg-type]
        self._marked(save.step, save.key, path, verdict)  # type: ignore[arg-type]
        parts.prune_parts(self.part_root, self.basename, keep=self.local_max_to_keep, held=self._held())
        return path  # type: ignore[return-value]

    def _marked(self, step: int, key: str, path: str, verdict: dict) -> None:  # committed: copied when due
        if verdict["persist"] and self._persister is not None:
            self._persister.enqueue(step, key, path)

    def _held(self) -> set[int]:  # the steps local retention keeps whatever their age (a copy pending)
        return self._persister.held() if self._persister else set()

    def _decide(self, save: dcp_commit.ShardedSave, channel: dcp_commit.Channel, deadline: float) -> dict:
        """The chief's commit: every rank's part durable, the lease held; and whether to persist."""
        error = ""
        for rank in range(save.world_size):
            outcome = channel.wait(f"{save.key}/tier-{rank}", deadline=deadline, what=f"rank {rank}'s local part")
            if not outcome["ok"]:
                error = outcome["message"]
                break
        if not error and channel.abort.is_set():
            error = "rank 0: the checkpoint manager is closing after an error; not committed"
        if not error and save.before_commit is not None:
            try:
                save.before_commit()
            except Exception as e:  # noqa: BLE001 - e.g. a lost lease: nothing is committed
                error = f"rank 0: {type(e).__name__}: {e}"
        verdict = self._verdict(error, save.step)
        channel.post(f"{save.key}/tier-verdict", verdict)
        return verdict

    def _verdict(self, error: str, step: int) -> dict:  # the chief's: the error ("": committed), persist?
        return {"error": error, "persist": not error and self._due(step)}

    def _due(self, step: int, *, force: bool = False) -> bool:
        now = self._clock.time()
        last_step, last_time = self._scheduled
        due = is_due(step, now, last_step=last_step, last_time=last_time, every_steps=self.persist_every_steps,
                     every_secs=self.persist_every_secs) or (force and (last_step is None or step > last_step))
        if not due or self._persister is None or not self._persister.idle():
            return False
        self._scheduled = (step, now)
        return True

    # ---------------------------------------------------------------- the copy to the logdir
    def _persist(self, step: int, key: str, path: str) -> None:
        """This rank's part of persisting ``step`` (module docstring, 3), on the persist thread."""
        channel = dcp_commit.channel_for(self._final_abort)
        deadline = time.monotonic() + self.save_timeout_secs
        start = time.perf_counter()
        if self._rank == 0:
            verdict = self._persist_as_chief(step, key, path, channel, deadline)
        else:
            verdict = channel.wait(f"{key}/persist-path", deadline=deadline, what="the chief's staged copy")
            if not verdict.get("error"):
                try:
                    mine = {"ok": True, "records": parts.copy_part(path, self.local_storage, verdict["path"],
                                                                   self.storage, self._rank)}
                except Exception as e:  # noqa: BLE001 - reported to the chief
                    mine = {"ok": False, "message": f"rank {self._rank}: {type(e).__name__}: {e}"}
                channel.post(f"{key}/persist-{self._rank}", mine)
                verdict = channel.wait(f"{key}/persist-verdict", deadline=deadline, what="the chief's copy")
        if verdict["error"]:
            self._copy_failed(step, verdict)
        else:
            self._copy_failures.succeeded()
            logger.debug("persisted step %d to %s in %.2f s", step, self.directory, time.perf_counter() - start)

    def _copy_failed(self, step: int, verdict: dict) -> None:
        """The save-failure policy for a failed copy (the same verdicts on every rank: the same count)."""
        cause = (LeaseLostError if verdict.get("lease_lost") else CheckpointError)(verdict["error"])
        failure = self._copy_failures.failed(
            f"persisting the sharded checkpoint of step {step} to {self.directory} failed", cause,
            tolerated_note="it stays in the local tiers and the next due checkpoint is persisted instead")
        if failure is not None and not self._final_abort.is_set():
            logger.error("%s", failure)
            self._deliver_failure(failure)

    def _persist_as_chief(self, step: int, key: str, path: str, channel: dcp_commit.Channel, deadline: float) -> dict:
        """Stages the copy, gathers every rank's, commits; posts and returns the verdict."""
        name = checkpoint_name(self.basename, step)
        inner = self._inner
        try:
            temp = TempCheckpoint.create(self.directory, name, self.storage, generation=inner.writer_generation())
        except Exception as e:  # noqa: BLE001 - the others stop waiting
            verdict = {"error": f"rank 0 cannot stage {name} in {self.directory}: {type(e).__name__}: {e}",
                       "lease_lost": isinstance(e, LeaseLostError)}
            channel.post(f"{key}/persist-path", verdict)
            return verdict
        channel.post(f"{key}/persist-path", {"path": temp.path})
        lease_lost = False
        try:
            error = self._gather_and_commit(temp, step, key, path, channel, deadline)
        except Exception as e:  # noqa: BLE001 - reported to every rank
            error, lease_lost = f"rank 0: {type(e).__name__}: {e}", isinstance(e, LeaseLostError)
        if error:
            temp.discard()
        verdict = {"error": error, "lease_lost": lease_lost}
        channel.post(f"{key}/persist-verdict", verdict)
        return verdict

    def _gather_and_commit(self, temp: TempCheckpoint, step: int, key: str, path: str,
                           channel: dcp_commit.Channel, deadline: float) -> str:
        """Every rank's copy (the chief's own first), then the merged metadata, seal, index, retention."""
        outcomes = [{"ok": True, "records": parts.copy_part(path, self.local_storage, temp.path, self.storage, 0)}]
        for rank in range(1, self._world):
            outcomes.append(channel.wait(f"{key}/persist-{rank}", deadline=deadline, what=f"rank {rank}'s copy"))
            if not outcomes[-1]["ok"]:
                return outcomes[-1]["message"]
        for outcome in outcomes:
            for rel, (nbytes, checksum) in outcome["records"].items():
                temp.add_record(rel, FileRecord(int(nbytes), str(checksum)))
        merged = parts.merged_metadata(temp.path, self.storage, self._world)
        temp.write_file(DCP_METADATA, lambda w: w.write(merged))
        wall_time = read_manifest(path, self.local_storage).wall_time
        temp.finalize(step=step, wall_time=wall_time, world_size=self._world, before_commit=self._inner.check_writer)
        self._inner.publish(temp.name, wall_time)
        self._inner.remove_dropped()
        return ""

    # ---------------------------------------------------------------- restoring
    def restore(self, state: Any, step: Any = None) -> Any:
        """The newest step every rank can restore from its local tier, when it is at least the
        logdir's newest; else the logdir's, as plain ``dcp`` (module docstring). ``step``
        (``restore_step=``): that step (`_restore_chosen`)."""
        self._settle()
        self._writer.wait()
        if step is not None:
            return self._restore_chosen(state, step)
        steps = parts.committed_steps(self.part_root, self.basename)
        checked: dict[int, bool] = {}

        def propose(candidate: int | None) -> int:
            for step in steps:
                if candidate is not None and step > candidate:
                    continue
                if step not in checked:
                    checked[step] = parts.verified_part(self.part_root, self.basename, step, self.local_storage,
                                                        world_size=self._world, verify=self.verify) is not None
                if checked[step]:
                    return step
            return -1

        persistent = self._scheduled[0] if self._inner is not None and self._scheduled[0] is not None else -1
        step, newest, persistent, empty, rounds = agree_step(
            propose, newest=steps[0] if steps else -1, persistent=persistent, empty_rank=-1 if steps else self._rank)
        logger.debug("the ranks agreed on local step %d in %d all-reduce round(s)", step, rounds)
        if step >= 0 and step >= persistent:
            restored = self._restore_local(state, step, "the logdir has no checkpoint yet" if persistent < 0 else (
                f"newer than the logdir's step {persistent}" if step > persistent else "the logdir holds the same step"))
        else:
            restored = super().restore(state)
            self._say_fallback(restored, newest, empty)
        parts.prune_parts(self.part_root, self.basename, keep=self.local_max_to_keep,
                          newer_than=restored.global_step if restored is not None else -1)
        return restored

    def _restore_local(self, state: Any, step: int, why: str, chosen: str = "") -> Any:
        path = os.path.join(self.part_root, checkpoint_name(self.basename, step))
        failure = None
        try:
            with warnings.catch_warnings():  # a one-rank load on purpose, not DCP's guess
                warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
                restored = restore_sharded(path, state, step=step, restore_rng=self.save_rng, no_dist=True,
                                           unpickling=self.unpickling, storage=self.local_storage)
        except CheckpointError as e:
            failure = e
        if all_reduce_max([int(failure is not None)])[0]:  # every rank fails alike, none trains on alone
            raise CheckpointError(f"restoring step {step} from the local tiers failed "
                                  f"({failure or 'on another rank'}); remove {self.local_dir} on the node that "
                                  "failed to resume from the logdir") from failure
        self._last_saved_step = self._last_committed_step = step
        logger.info("restored %sstep %d from the local tier %s on each of the %d rank(s) (%s)", chosen, step,
                    self.local_dir, self._world, why)
        return restored

    def _restore_chosen(self, state: Any, chosen: Any) -> Any:
        """``restore_step=``: from the local tiers when every rank holds a part of the step that
        verifies, else from the logdir (as plain ``dcp``; `CheckpointNotFoundError` naming the
        steps of both tiers when it lacks it too). Local parts of newer steps lose their mark
        (kept, never restored; replaced as the run saves their steps again, as after ``rollback``)."""
        path = chosen_path(self.directory, self.basename, chosen, self.storage)
        step = step_of(self.storage.basename(path), self.basename)
        held = step in parts.committed_steps(self.part_root, self.basename) and parts.verified_part(
            self.part_root, self.basename, step, self.local_storage, world_size=self._world, verify=self.verify)
        lacking = lowest_lacking(bool(held))
        if lacking < 0:
            restored = self._restore_local(state, step, "every rank holds it", chosen="the chosen ")
        else:
            restored = super().restore(state, step=chosen)
            if self._rank == 0:
                logger.info("restored the chosen step %d from the persistent tier %s: rank %d's local tier holds no "
                            "restorable part of it", step, self.directory, lacking)
        newer = sorted(s for s in parts.committed_steps(self.part_root, self.basename) if s > step)
        for old in newer:  # unmarked: never restored, each replaced when the run saves its step again
            parts.unmark(os.path.join(self.part_root, checkpoint_name(self.basename, old)))
        if newer:
            logger.warning("restore_step=%d: the local parts of the newer step(s) %s in %s are no longer restored (marks "
                           "removed; each is replaced when the run saves its step again)", step,
                           ", ".join(map(str, newer)), self.part_root)
        if self._scheduled[0] is not None and self._scheduled[0] > step:
            self._scheduled = (step, self._clock.time())  # persisting goes on from the chosen step
        return restored

    def _elsewhere(self, step: Any) -> str:
        steps = ", ".join(map(str, sorted(parts.committed_steps(self.part_root, self.basename))))
        return f"; the local tiers hold {'steps ' + steps if steps else 'no step'} (rank {self._rank}'s; restored " \
            "only when every rank holds it)"

    def _say_fallback(self, restored: Any, newest: int, empty: int) -> None:
        step = restored.global_step if restored is not None else -1
        note = fallback_note(step, newest, empty)
        if note is not None:
            logger.warning("restored %s from the persistent tier %s: %s", f"step {step}" if step >= 0 else "nothing",
                           self.directory, note)

    # ---------------------------------------------------------------- closing
    def close(self, *, failed: bool = False) -> None:
        """Finishes the local save in flight, persists the newest local step within
        ``persist_grace_secs`` (not after an error; a WARNING names what was not), closes as
        `ShardedCheckpointManager`, then prunes this rank's parts: the newest
        ``local_max_to_keep`` and those not persisted. Idempotent."""
        if self._closed:
            return
        try:
            if not failed:
                self._settle()
                self._writer.wait()
                self._persist_final()
        finally:
            if failed:
                self._final_abort.set()
            left = self._persister.stop() if self._persister is not None else []
            if left and not failed:
                logger.warning("the sharded checkpoint(s) of step %s were not persisted to %s within "
                               "persist_grace_secs=%s; they stay in the local tiers (%s), which a resume on "
                               "these nodes restores", ", ".join(map(str, left)), self.directory,
                               self.persist_grace_secs, self.local_dir)
            try:
                super().close(failed=failed)
            finally:
                if self._writer.join(0):  # retention once more: a part whose copy ended is not kept past it
                    parts.prune_parts(self.part_root, self.basename, keep=self.local_max_to_keep, held=left)

    def _persist_final(self) -> None:
        """Every rank: the chief says whether the newest local step still needs its copy (through
        the store), each rank queues its part, and waits up to ``persist_grace_secs``."""
        if self._persister is None:
            return
        key = distributed.env.agreed_key("dcp-tier-final") if distributed.is_initialized() else "dcp-tier-final"
        channel = dcp_commit.channel_for(self._final_abort)
        grace = self.persist_grace_secs
        deadline = time.monotonic() + (grace if grace is not None else self.save_timeout_secs)
        if self._rank == 0:
            self._persister.flush(grace)
            last = self._last_committed_step
            step = last if last is not None and self._due(last, force=True) else None
            channel.post(f"{key}/step", {"step": step})
        else:
            try:  # the chief first waits for its copy in flight: up to the grace, then decides
                step = channel.wait(f"{key}/step", deadline=deadline + (grace or 0) + 30,
                                    what="the chief's final copy")["step"]
            except CheckpointError as e:
                logger.warning("not persisting the final sharded checkpoint: %s", e)
                return
        if step is not None:
            path = os.path.join(self.part_root, checkpoint_name(self.basename, step))
            self._persister.enqueue(step, f"{key}/copy", path)
        self._persister.flush(max(0.0, deadline - time.monotonic()))
