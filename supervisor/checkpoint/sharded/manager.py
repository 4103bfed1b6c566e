"""`ShardedCheckpointManager`: ``checkpoint_format="dcp"`` in a session (its creator is
`supervisor.creators.sharded.ShardedSessionCreator`).

Every rank has a manager; each save is a collective (every rank calls ``save`` at the same step,
which the `CollectiveAgreement` guarantees) through the commit protocol of
`supervisor.checkpoint.sharded.commit`. Restores are decided by the chief (verified, §5.4) and
loaded by every rank (`supervisor.checkpoint.sharded.state_dict.restore_sharded`, resharding as needed).
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Mapping

from supervisor import distributed
from supervisor._validate import check_choice, check_number
from supervisor.checkpoint.sharded import commit as dcp_commit, restore as dcp_restore
from supervisor.checkpoint.sharded.state_dict import build_state_dict, restore_sharded
from supervisor.checkpoint.layout.format import checkpoint_name
from supervisor.checkpoint.save import overlap
from supervisor.checkpoint.arguments import check_capture, resolve_directory
from supervisor.checkpoint.save.overlap import PendingCopy, check_copier, discarded_message
from supervisor.checkpoint.load.apply import Restored
from supervisor.checkpoint.save.staging import StagingArea
from supervisor.checkpoint.save.in_flight import ManagerCommon, before_commit
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.clock import resolve_clock
from supervisor.errors import CheckpointError
from supervisor.state.resume import loader_generators
from supervisor.state.rng import capture_rng_state
from supervisor.state import TrainingState

__all__ = ["ShardedCheckpointManager"]

logger = logging.getLogger(__name__)

#: How long ``close(failed=True)`` waits for a save still in flight before leaving it behind.
FAILED_CLOSE_JOIN_SECS = 10.0


class _SaveThread:
    """At most one save in flight, each on its own **daemon** thread.

    Unlike `BackgroundWriter` (non-daemon, so a process exiting without ``close()`` still
    commits), a sharded save can be blocked in a collective of its side group by a peer that is
    alive but never joins the save; a daemon thread lets a failed close give up on it after a
    bounded time (`FAILED_CLOSE_JOIN_SECS`) and the process exit. A save cut short that way
    leaves only its temp directory. A clean close waits for the save to finish.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None], after: Callable[[], None]) -> None:
        if not self._idle.is_set():
            raise RuntimeError("a save is already in flight; wait() for it before submitting another")
        self._idle.clear()
        self._thread = threading.Thread(target=self._run, args=(job, after), name=self._name, daemon=True)
        self._thread.start()

    def _run(self, job: Callable[[], None], after: Callable[[], None]) -> None:
        try:
            job()
        except BaseException:  # noqa: BLE001 - jobs report their own errors; this is a last resort
            logger.exception("the sharded checkpoint writer's job failed outside its own error handling")
        finally:
            del job  # drop the staged state before signalling: the next capture reuses its buffers
            self._idle.set()
        try:
            after()
        except Exception:  # noqa: BLE001 - cleanup only; the save itself is committed
            logger.exception("the sharded checkpoint writer's cleanup failed")

    def wait(self, timeout: float | None = None) -> float:
        """Blocks until no save is in flight (at most ``timeout``); returns the seconds waited."""
        if self._idle.is_set():
            return 0.0
        start = time.perf_counter()
        self._idle.wait(timeout)
        return time.perf_counter() - start

    def join(self, timeout: float | None = None) -> bool:
        """Joins the last save's thread (cleanup included); whether it ended."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        return True


class ShardedCheckpointManager(ManagerCommon):
    """The checkpoint manager of ``checkpoint_format="dcp"``: one on **every** rank.

    ``save`` is a collective. With ``save_mode="async"`` (default) it blocks the caller only to
    copy the state into reused CPU buffers (DTensors as their local shards) and capture this
    rank's RNG and loader-generator states; a background thread then writes this rank's shards
    (``dcp.save`` over a gloo group of the manager's own, made at the first save), sends their
    checksums to the chief through the store, and the chief seals, renames and publishes. Like
    `CheckpointManager`, at most one save is in flight: a save that falls due meanwhile first
    waits for it (never skipped). ``save(wait=True)``, ``wait()`` and ``close()`` return once
    the save is committed on every rank (the final save of a session is waited for at its
    close). ``save_mode="sync"`` writes on the calling thread (``dcp.save`` over the default
    group).

    Each commit is reported through ``on_commit(step, path)`` on every rank (from the writer
    thread for async saves). A failed save fails on every rank with the chief's verdict: raised
    by a waited-for save, else handed to ``on_error`` (the session wires ``request_stop``), else
    raised by the next ``save``, ``wait`` or ``close`` (``max_consecutive_save_failures`` does
    not apply). The chief holds an inner `CheckpointManager` for what only it does: the
    ownership lock, cleaning up a crashed writer's temp directories, the index and retention.

    Args:
        directory, basename, max_to_keep, keep_checkpoint_every_n_hours, save_mode, verify,
        save_rng, trusted_globals, clock: as `CheckpointManager`.
        max_wait_secs: how long a non-chief rank waits for the chief's restore decision.
        capture, copier: as `CheckpointManager`, per rank: an overlapped capture copies this
            rank's parameters (local shards) and optimizer state while the next step runs. The
            ranks agree through the store before writing: when any rank's tensors were written
            during its copy, every rank discards the save (a WARNING naming the rank and tensor).
        save_timeout_secs: the longest a rank waits for another's part of one save (the
            background group's collective timeout, and the waits on the store).
        lock, lease_secs: the chief's writer lock, as `CheckpointManager` (default ``"auto"``:
            ``"flock"`` on a local path; use ``"lease"`` on NFS/Lustre, where ``flock`` may be
            node-local; on an object store ``"auto"`` is the lease). The chief checks it right
            before sealing each save: a chief that lost its lease commits nothing and the save
            fails on every rank, naming `LeaseLostError`.
        storage_options: for an object-store ``directory`` (``s3://bucket/prefix``), the
            client's options, as `CheckpointManager` — needed on **every** rank: each uploads
            its own shards (``dcp_storage.StorageDcpWriter``: checksummed while uploading) and
            reads its own part at a restore. The commit is the same protocol in object-store
            form: every rank uploads into the checkpoint's prefix, the chief — once every rank
            reported — has DCP's ``.metadata`` uploaded, checks its lease, writes
            ``MANIFEST.json`` last (create-only), then the index (``If-Match``), then retention.
            A save cut short leaves a manifest-less prefix, never a checkpoint; the next writer
            opening the logdir removes it (WARNING).
    """

    collective = True  # every rank calls save() at the same step

    def __init__(self, directory: str | os.PathLike, *, basename: str = "model.ckpt",
                 max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float | None = 10000.0,
                 save_mode: str = "async", verify: str = "full", save_rng: bool = True,
                 trusted_globals: Any = (), max_wait_secs: float = 7200, save_timeout_secs: float = 1800.0,
                 clock: Any = None, capture: str = "auto", copier: Any = None, lock: str = "auto",
                 lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None) -> None:
        self._chief = distributed.rank() == 0
        inner = CheckpointManager(resolve_directory(directory, storage_options), basename=basename, max_to_keep=max_to_keep,
                                  keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                                  save_mode="sync", verify=verify, save_rng=save_rng,
                                  trusted_globals=trusted_globals, clock=clock, lock=lock, lease_secs=lease_secs)
        self.directory, self.basename, self.verify = inner.directory, inner.basename, inner.verify
        self.storage = inner.storage  # the logdir's Storage: every rank's shards, the finished mark, the index
        self.lock, self.lease_secs = inner.lock, inner.lease_secs
        self.save_rng, self.trusted_globals, self.unpickling = inner.save_rng, inner.trusted_globals, inner.unpickling
        self.save_mode = check_choice("save_mode", save_mode, ("async", "sync"))
        self.capture = check_capture(capture)
        self._copier = check_copier(copier)
        self._pending: PendingCopy | None = None
        self._copy_keys: list[str] = []  # the chief deletes the previous save's copy verdicts
        self.max_wait_secs = check_number("max_wait_secs", max_wait_secs, minimum=0)
        self.save_timeout_secs = check_number("save_timeout_secs", save_timeout_secs, strictly_positive=True)
        self._inner = inner if self._chief else None
        self._clock = resolve_clock(clock)
        self.on_commit: Callable[[int, str], Any] | None = None
        self.on_error: Callable[[CheckpointError], Any] | None = None
        self._writer = _SaveThread("supervisor-dcp-writer")
        self._staging = StagingArea()
        self._abort = threading.Event()
        self._group: Any = None
        self._mutex = threading.Lock()
        self._failure: CheckpointError | None = None
        self._failure_delivered = False
        self._last_saved_step: int | None = None
        self._last_committed_step: int | None = None
        self._closed = False

    @property
    def last_saved_step(self) -> int | None:
        """The step of the newest save committed or in flight (or restored); None before any."""
        return self._last_saved_step

    @property
    def checkpoints(self) -> tuple[str, ...]:
        return self._inner.checkpoints if self._inner is not None else ()

    def path_of(self, step: int) -> str:
        """The path the checkpoint of ``step`` is committed to."""
        return self.storage.join(self.directory, checkpoint_name(self.basename, step))

    def open(self) -> None:
        if self._inner is not None:
            self._inner.open()

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: TrainingState, *, wait: bool = False, rng_states: Any = None) -> str:
        """Every rank's shards of ``state`` at ``step`` (a collective; see the class docstring).
        ``rng_states`` is accepted as by `CheckpointManager.save` and unused: each rank writes its own.

        Returns:
            The path the checkpoint is committed to.

        Raises:
            CheckpointError: this save failed and was waited for (``save_mode="sync"`` or
                ``wait=True``), or an earlier failure not yet reported.
        """
        durable = self._take_durable()
        step = self._begin_save(step, state, kind="sharded checkpoint manager",
                                is_open=not self._closed and (self._inner is None or self._inner.is_open))
        background = self.save_mode == "async"
        if background and self._group is None and distributed.is_initialized():
            self._group = dcp_commit.side_group(self.save_timeout_secs)  # every rank's first save
        # A save the caller waits for writes the live state (as CheckpointManager): the caller is
        # blocked until the commit, so nothing changes it meanwhile; no staging copy is made.
        job, pending = self._job(step, state, stage=background and not wait, background=background, durable=durable)
        self._last_saved_step = step
        self._pending = pending
        outcome: list[CheckpointError] | None = [] if wait or not background else None
        run = functools.partial(self._run, job, outcome, pending)
        del pending
        if background:
            self._writer.submit(run, after=self._remove_dropped)
            if wait:
                self._writer.wait()
        else:
            run()
            self._remove_dropped()
        if outcome:
            raise outcome[0]
        return self.path_of(step)

    def _job(self, step: int, state: TrainingState, *, stage: bool, background: bool,
             durable: Callable[[], Any] | None = None) -> tuple[dcp_commit.ShardedSave, PendingCopy | None]:
        """The capture, on the caller's thread: the state dict (``stage``: copied into the staging
        buffers, the optimizers' tensors in the background when overlapped), this rank's RNG and
        loader-generator states, the save's store key."""
        rank, size = dcp_commit.rank_and_size()
        key = dcp_commit.next_save_key()  # first: every rank numbers this save, even if its capture fails
        pending = None
        try:
            state_dict = build_state_dict(state)
            if stage:
                objects, keys = overlap.plan(state, self.capture)
                with self._staging.deferring(keys) as deferral:
                    state_dict = dcp_commit.stage(state_dict, self._staging)
                pending = overlap.start(deferral, objects, self._copier)
            rng = capture_rng_state(loader_generators(state)) if self.save_rng else None
        except Exception as e:
            raise CheckpointError(f"capturing the training state for the sharded checkpoint of step {step} "
                                  f"failed: {type(e).__name__}: {e}") from e
        return dcp_commit.ShardedSave(
            self.directory, checkpoint_name(self.basename, step), step, self._clock.time(), state_dict, rng,
            key, rank=rank, world_size=size, group=self._group if background else None,
            timeout_secs=self.save_timeout_secs,
            publish=self._inner.publish if self._inner is not None else None,
            before_commit=before_commit(durable, self._inner.check_writer) if self._inner is not None else None,
            generation=self._inner.writer_generation() if self._inner is not None else None,
            storage=self.storage), pending

    def _run(self, save: dcp_commit.ShardedSave, outcome: list[CheckpointError] | None,
             pending: PendingCopy | None = None) -> None:
        try:
            if pending is not None and not self._agree_copied(save, pending):
                return
            path = self._commit(save, dcp_commit.channel_for(self._abort))
        except CheckpointError as e:
            self._failed(save.step, e, outcome)
            return
        finally:
            save.state_dict = None  # the staging buffers are reused by the next capture
        self._last_committed_step = save.step
        self._report_commit(save.step, path)

    def _commit(self, save: dcp_commit.ShardedSave, channel: dcp_commit.Channel) -> str:
        """This rank's part of the commit protocol (a tiered manager writes its local tier instead)."""
        return dcp_commit.commit(save, channel)

    def _agree_copied(self, save: dcp_commit.ShardedSave, pending: PendingCopy) -> bool:
        """Every rank's verdict on its overlapped copy, through the store: True when all are
        complete; else every rank discards the save (nothing written) and logs why."""
        try:
            verdict = {"moved": pending.outcome()}
        except Exception as e:  # noqa: BLE001 - this rank's copy failed: the save fails on every rank
            verdict = {"error": f"{type(e).__name__}: {e}"}
        channel = dcp_commit.channel_for(self._abort)
        deadline = time.monotonic() + save.timeout_secs
        try:
            channel.post(f"{save.key}/copy-{save.rank}", verdict)
            verdicts = [channel.wait(f"{save.key}/copy-{r}", deadline=deadline, what=f"rank {r}'s overlapped copy")
                        for r in range(save.world_size)]
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. the store is gone with the chief
            raise CheckpointError(f"the sharded checkpoint of step {save.step}: rank {save.rank} could not "
                                  f"exchange the overlapped copies' verdicts: {type(e).__name__}: {e}") from e
        if save.rank == 0:
            channel.delete(self._copy_keys)  # every rank has left the previous save's agreement
            self._copy_keys = [f"{save.key}/copy-{r}" for r in range(save.world_size)]
        errors = [f"rank {r}: {v['error']}" for r, v in enumerate(verdicts) if "error" in v]
        if errors:
            raise CheckpointError(f"copying the state for the sharded checkpoint of step {save.step} failed "
                                  f"({'; '.join(errors)})")
        moved = [f"rank {r}: {name}" for r, v in enumerate(verdicts) for name in v["moved"]]
        if not moved:
            return True
        with self._mutex:
            self._last_saved_step = self._last_committed_step
        logger.warning("%s", discarded_message(save.step, moved))
        return False

    def _failed(self, step: int, failure: CheckpointError, outcome: list[CheckpointError] | None) -> None:
        """A waited-for save's failure goes to its caller, else to ``on_error``, else to the next call."""
        with self._mutex:
            self._last_saved_step = self._last_committed_step
        if outcome is not None:
            outcome.append(failure)
            return
        logger.error("%s", failure)
        self._deliver_failure(failure)

    def _remove_dropped(self) -> None:
        """Deletes what retention moved aside (the chief), after the save reported done."""
        if self._inner is not None:
            self._inner.remove_dropped()

    def wait(self) -> None:
        """Blocks until no save is in flight (committed or failed on every rank); raises a fatal
        failure ``on_error`` did not take, to every waiter, until the next save starts."""
        self._settle()
        self._writer.wait()
        self._raise_undelivered()

    # ---------------------------------------------------------------- restoring and closing
    def restore(self, state: TrainingState, step: int | str | os.PathLike | None = None) -> Restored | None:
        """The chief chooses (§5.4) and posts its choice; every rank loads exactly it, verifying
        the ranges it reads (`supervisor.checkpoint.sharded.restore`). ``step`` (``restore_step=``:
        a step or one of its checkpoint paths): that checkpoint, never another one in its place
        (`CheckpointNotFoundError` naming the steps there)."""
        self._settle()
        self._writer.wait()  # a save in flight is the newest checkpoint
        chooser = dcp_restore.choose_sharded if step is None else functools.partial(
            dcp_restore.choose_chosen, chosen=step, elsewhere=self._elsewhere(step))
        restored = dcp_restore.restore_in_job(
            lambda skip: chooser(self.directory, self.basename, verify=self.verify, storage=self.storage, skip=skip),
            lambda path, step, manifest, metadata, items: restore_sharded(
                path, state, step=step, restore_rng=self.save_rng, unpickling=self.unpickling,
                storage=self.storage, manifest=manifest, metadata=metadata, verify=self.verify, items=items),
            max_wait_secs=self.max_wait_secs, clock=self._clock, storage=self.storage)
        if restored is not None:
            self._last_saved_step = self._last_committed_step = restored.global_step
        return restored

    def _elsewhere(self, step: Any) -> str:
        """What other tiers hold, for the error of a chosen ``step`` the logdir lacks (none here)."""
        return ""

    def close(self, *, failed: bool = False) -> None:
        """Finishes the save in flight and releases the lock. ``failed=False`` waits for the save
        to commit and re-raises a failure not yet raised on a caller's thread. ``failed=True``
        (closing after an error): the save in flight is abandoned — a rank waiting on the store
        stops waiting, the chief seals nothing and discards the temp directory — and waited for
        at most `FAILED_CLOSE_JOIN_SECS` (a thread blocked in a collective is left behind, with
        a WARNING). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._settle()
        if failed:
            self._abort.set()
        try:
            if not self._writer.join(FAILED_CLOSE_JOIN_SECS if failed else None):
                logger.warning("closing after an error: the sharded save in flight did not end within %g s "
                               "(blocked in a collective with a rank that never joined it?); leaving it "
                               "behind — its temp directory is removed when the logdir is next opened",
                               FAILED_CLOSE_JOIN_SECS)
        finally:
            self._staging.release()
            if self._inner is not None:
                self._inner.close(failed=failed)
        failure = self._take_failure()
        if failure is not None and not failed:
            raise failure

    def __repr__(self) -> str:
        return (f"ShardedCheckpointManager({self.directory!r}, basename={self.basename!r}, "
                f"save_mode={self.save_mode!r})")
