"""`TieredCheckpointManager`: checkpoint tiers (SPEC §17), a node-local tier and the logdir.

Saves go to the local tier (``local_dir``: a local disk, tmpfs or ``/dev/shm``), a
`CheckpointManager` of its own with the local commit protocol and ``local_max_to_keep``: the
capture is the only part that blocks training, as for any save. Each local commit is offered to
the `supervisor.checkpoint.tiers.persist.Persister`, which copies the due ones (every
``persist_every_steps`` steps or ``persist_every_secs`` seconds) from the committed local files
into the logdir in the background — verified on arrival, committed with the logdir's own
protocol (rename; manifest last under the lease on an object store), then indexed there and
retained with ``max_to_keep``. The local tier's retention keeps a checkpoint whose copy is
pending or in flight. ``keep_best``/``keep_period`` rank the logdir's checkpoints by the metric
each save recorded; one they keep is persisted even when not due (docs/tiers.md). A restore
takes the newest checkpoint that verifies in either tier (`supervisor.checkpoint.tiers.restore`),
with an INFO line naming the tier. ``close`` persists the
final checkpoint (a preempted run's too) within ``persist_grace_secs``; what it could not is
said in a WARNING.

It offers what the session, the front doors and the checkpoint hook use of a `CheckpointManager`;
``directory`` is the logdir (the persistent tier, which evaluators, the CLI and the finished
mark use), ``local_dir`` the local tier.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Iterable, Mapping

from supervisor._validate import check_choice
from supervisor.checkpoint.layout.best import SOURCES, MetricKeeper, check_retention
from supervisor.checkpoint.layout.format import checkpoint_name
from supervisor.checkpoint.load.apply import Restored, apply_checkpoint
from supervisor.checkpoint.load.choose import load_chosen
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.save.in_flight import PendingSave
from supervisor.checkpoint.arguments import check_directory
from supervisor.checkpoint.storage import resolve_location
from supervisor.checkpoint.tiers.local import LocalTier
from supervisor.checkpoint.tiers.persist import Persister
from supervisor.checkpoint.tiers.record import RECORD_FILE, read_record, remove_record, write_record
from supervisor.checkpoint.tiers.restore import Tier, TierChoice, describe, find_in_tiers
from supervisor.checkpoint.tiers.options import check_tiers
from supervisor.clock import Clock, resolve_clock
from supervisor.errors import CheckpointCorruptError, CheckpointError
from supervisor.state import TrainingState

__all__ = ["TieredCheckpointManager", "make_manager"]

logger = logging.getLogger(__name__)


class TieredCheckpointManager:
    """Saves to a node-local tier, persists every K-th save to the logdir (module docstring).

    Example::

        manager = TieredCheckpointManager("s3://bucket/run", local_dir="/dev/shm/run", persist_every_steps=1000)
        manager.open()
        manager.restore(state)            # the newest checkpoint that verifies in either tier
        manager.save(step, state)         # to /dev/shm/run; copied to the bucket when due
        manager.close()                   # persists the final checkpoint, releases both tiers

    Args:
        directory: the logdir (the persistent tier): a local path, shared filesystem or URL.
        local_dir: the node-local tier's directory (a local path; not the logdir or inside it).
        persist_every_steps, persist_every_secs: how often a local checkpoint is copied to the
            logdir (give one; default when neither: every 600 s). The first one always is.
        local_max_to_keep: how many checkpoints the local tier keeps (default 2, its newest).
        keep_best, best_metric, best_mode, keep_period: the logdir's (as `CheckpointManager`): a
            local checkpoint these keep is copied to the logdir even when not due, with its metric.
        persist_grace_secs: how long ``close`` waits for the final copy (None: until done).
        max_to_keep, keep_checkpoint_every_n_hours, lock, lease_secs, storage_options: the
            logdir's retention, single-writer lock and client (as `CheckpointManager`).
        Every other argument is `CheckpointManager`'s, for the local tier's saves and restores
        (``max_consecutive_save_failures`` also applies to the copies).
    """

    collective = False

    def __init__(self, directory: str | os.PathLike, *, local_dir: str | os.PathLike,
                 persist_every_steps: int | None = None, persist_every_secs: float | None = None,
                 local_max_to_keep: int | None = 2, persist_grace_secs: float | None = 120.0,
                 basename: str = "model.ckpt", max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = 10000.0, lock: str = "auto",
                 lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None,
                 keep_best: int | None = None, best_metric: Any = None, best_mode: str = "min",
                 keep_period: int | None = None, **local_options: Any) -> None:
        self.directory = check_directory(directory)
        tiers = check_tiers(local_dir=local_dir, persist_every_steps=persist_every_steps,
                            persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep,
                            persist_grace_secs=persist_grace_secs, logdir=self.directory)
        self.local_dir, self.persist_grace_secs = tiers["local_dir"], tiers["persist_grace_secs"]
        self.storage = resolve_location(directory, storage_options).storage  # a Location's own
        self._clock = resolve_clock(local_options.get("clock"))
        self._failure: CheckpointError | None = None
        self._failure_raised = self._closed = False
        self._mutex = threading.Lock()
        self._last_local: tuple[int, str, float | None] | None = None  # (step, path, metric)
        # The logdir opened in the background: its newest step once known; the step a restore
        # took from the local tier without waiting (checked when the logdir opens); what waits.
        self._logdir_known, self._logdir_newest = False, None
        self._fast_step: int | None = None
        self._after_open: list[Callable[[], Any]] = []
        self.on_commit: Callable[[int, str], Any] | None = None
        rule = check_retention(max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                               keep_best=keep_best, best_metric=best_metric, best_mode=best_mode, keep_period=keep_period)
        self.local = LocalTier(self.local_dir, held=lambda: self.persister.held(), basename=basename,
                               max_to_keep=tiers["local_max_to_keep"], best_metric=best_metric, **local_options)
        self.persister = Persister(
            self.directory, self.storage, basename=self.local.basename, max_to_keep=max_to_keep, rule=rule,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, lock=lock, lease_secs=lease_secs,
            every_steps=tiers["persist_every_steps"], every_secs=tiers["persist_every_secs"], clock=self._clock,
            source_storage=self.local.storage, on_failure=self._persist_failed,
            max_consecutive_failures=self.local.max_consecutive_save_failures)
        self.local.on_commit = self._committed
        self.persister.on_persisted = self._persisted
        self.basename, self.max_to_keep = self.local.basename, max_to_keep

    # ------------------------------------------------------------ what a CheckpointManager offers
    on_error = property(lambda self: self.local.on_error,
                        lambda self, value: setattr(self.local, "on_error", value))
    last_saved_step = property(lambda self: self.local.last_saved_step)
    is_open = property(lambda self: self.local.is_open)
    save_mode = property(lambda self: self.local.save_mode)

    @property
    def checkpoints(self) -> tuple[str, ...]:
        """Paths of the logdir's checkpoints its retention manages, oldest first (after `open`)."""
        kept = self.persister.publisher.retention
        return tuple(self.storage.join(self.directory, n) for n in (kept.names if kept is not None else ()))

    def path_of(self, step: int) -> str:
        """Where the save of ``step`` is committed: the local tier."""
        return self.local.path_of(step)

    def open(self) -> None:
        """Opens the local tier (its lock, cleanup and retention); the logdir's side (its lock or
        lease, cleanup and index: `Persister.open`) opens in the background once something needs
        it: a restore the local tier cannot serve alone, the first copy, `open_logdir` (a session
        calls it after its first step) or `persist`; a close before any of them leaves it unopened."""
        if self.local.is_open:
            return
        self.local.open()
        self.persister.open(on_open=self._logdir_opened, deferred=True)

    def open_logdir(self) -> None:
        """Starts opening the logdir in the background now (its lock or lease, cleanup, index),
        without waiting: a failure (another writer, an unreachable store) is the session's fatal
        error, as a failed copy's. A session calls it after its first step."""
        self.persister.open_now()

    def when_logdir_open(self, action: Callable[[], Any]) -> None:
        """Runs ``action()`` once the logdir is open (now if it is), before anything is persisted:
        what a session does in the logdir (e.g. clearing the finished mark) without waiting on it."""
        with self._mutex:
            if not self._logdir_known:
                self._after_open.append(action)
                return
        action()

    def _logdir_opened(self, newest: int | None) -> None:
        """On the persist worker, the logdir open: checks the restore that did not wait for it,
        runs what waited for the open, records the logdir's newest step in the local tier."""
        with self._mutex:
            self._logdir_known, self._logdir_newest, fast = True, newest, self._fast_step
            actions, self._after_open = self._after_open, []
        if fast is not None and newest is not None and newest > fast:
            remove_record(self.local.storage, self.local_dir)
            raise CheckpointError(
                f"the logdir {self.directory} holds step {newest}, newer than step {fast} this session restored from "
                f"the local tier {self.local_dir} without waiting for the logdir: another writer trained from the "
                f"logdir after this node last wrote it. Nothing of this session is persisted; restart the job and it "
                f"resumes from step {newest} (the local tier's record {RECORD_FILE} was removed, so the next start "
                "waits for the logdir)")
        for action in actions:
            action()
        write_record(self.local.storage, self.local_dir, self.directory, newest)

    def _persisted(self, step: int) -> None:
        try:
            write_record(self.local.storage, self.local_dir, self.directory, step)
        except OSError as e:  # the next start then waits for the logdir: slower, never wrong
            remove_record(self.local.storage, self.local_dir)
            logger.warning("could not record the logdir's step %d in %s (%s)", step, self.local_dir, e)

    def check_writer(self) -> None:
        self.persister.check_writer()

    def writer_generation(self) -> int | None:
        return self.persister.writer_generation()

    # ------------------------------------------------------------ saving
    def save(self, step: int, state: TrainingState, *, wait: bool = False,
             rng_states: Mapping[int, Any] | None = None) -> str:
        """`CheckpointManager.save` into the local tier; the copy to the logdir follows when due."""
        self._raise_failure()
        return self.local.save(step, state, wait=wait, rng_states=rng_states)

    def start_save(self, step: int, state: TrainingState, *, wait: bool = False,
                   rng_states: Mapping[int, Any] | None = None, durable: Callable[[], Any] | None = None) -> PendingSave:
        self._raise_failure()
        return self.local.start_save(step, state, wait=wait, rng_states=rng_states, durable=durable)

    def wait(self) -> None:
        """Waits for the local save in flight (never for a copy to the logdir: `persist`)."""
        self.local.wait()
        self._raise_failure()

    def persist(self, timeout_secs: float | None = None) -> bool:
        """Persists the newest local checkpoint now (unless it is already) and waits for the copy;
        False when ``timeout_secs`` ran out first."""
        self.local.wait()
        with self._mutex:
            last = self._last_local
        if last is not None:
            self.persister.offer(*last[:2], force=True, metric=last[2])
        done = self.persister.flush(timeout_secs)
        self._raise_failure()
        return done

    @property
    def metrics(self) -> MetricKeeper:
        """How checkpoints are judged by a metric (``keep_best``: `supervisor.checkpoint.layout.best`)."""
        return self.local.metrics

    def report_metrics(self, step: int, metrics: Any, *, source: str = "evaluation") -> None:
        """`CheckpointManager.report_metrics`: the metric ranks the checkpoint of ``step`` in the
        logdir. One reported after its local commit goes with its pending copy, into the logdir's
        index when it is there, or makes a copy when it makes the step one the logdir keeps; too
        late for that (newer steps persisted) it is not kept, a WARNING."""
        value = self.local.metrics.value(metrics, check_choice("source", source, SOURCES))
        saved = self.local.last_saved_step
        if value is None or saved is None or step > saved or not self.local.is_open:
            if value is not None:
                self.local.metrics.note(step, value, source)
            return
        self.local.wait()
        name, path = checkpoint_name(self.basename, step), self.local.path_of(step)
        if self.persister.record_metric(step, name, value) or not self.persister.keeps(step, name, value):
            return
        if not (self.local.storage.exists(path) and self.persister.offer(step, path, metric=value)):
            logger.warning("the metric %s=%g of step %d arrived after newer checkpoints were persisted to %s (or "
                           "after the local tier deleted it): the checkpoint of step %d is not kept there; report "
                           "metrics before the next save", self.local.metrics.best_metric, value, step,
                           self.directory, step)

    def _committed(self, step: int, path: str) -> None:
        metric = self.local.metric_of(self.local.storage.basename(path))
        with self._mutex:
            self._last_local = (step, path, metric)
        self.persister.offer(step, path, metric=metric)
        on_commit = self.on_commit
        if on_commit is not None:
            on_commit(step, path)

    def _persist_failed(self, failure: CheckpointError) -> None:
        with self._mutex:
            if self._failure is None:
                self._failure, self._failure_raised = failure, False
        on_error = self.local.on_error
        if on_error is not None:
            on_error(failure)

    def _raise_failure(self) -> None:
        with self._mutex:
            failure, raised = self._failure, self._failure_raised
            self._failure_raised = True
        if failure is not None and not raised:
            raise failure

    def close(self, *, failed: bool = False) -> None:
        """Closes the local tier (finishing the save in flight), persists its newest checkpoint
        within ``persist_grace_secs`` (WARNING for what was not), runs local retention once more
        (the checkpoints whose copies ended are no longer held), releases the logdir. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.local.before_release = self._finish_persisting
        try:
            self.local.close(failed=failed)
        finally:
            if self.local.before_release is not None:  # the local tier never got to release its lock
                self._finish_persisting()
        with self._mutex:
            failure, raised, self._failure = self._failure, self._failure_raised, None
        if failure is not None and not failed and not raised:
            raise failure

    def _finish_persisting(self) -> set[str]:
        """Closing, the local save in flight committed: persists the newest local checkpoint within
        ``persist_grace_secs``; returns the names not persisted (local retention keeps those and
        its newest ``local_max_to_keep``: nothing already persisted is kept past them)."""
        self.local.before_release = None
        with self._mutex:
            last = self._last_local
        if last is not None:
            self.persister.offer(*last[:2], force=True, metric=last[2])
        done = self.persister.flush(self.persist_grace_secs)
        left = self.persister.held()
        self.persister.close(self.persist_grace_secs if done else 0.0)  # a WARNING names what is left
        return left

    def __enter__(self) -> TieredCheckpointManager:
        self.open()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(failed=exc is not None)

    # ------------------------------------------------------------ restoring
    def restore(self, state: TrainingState, step: int | str | os.PathLike | None = None, *,
                keep_copy: bool = False) -> Restored | None:
        """Restores the newest checkpoint that verifies in either tier (`tier_restore`), with an
        INFO line naming the tier; ``step``: that step, from the local tier if it has it, else
        from the logdir (`CheckpointManager.restore`). The local tier's newest is restored without
        waiting for the logdir when the local tier's record proves it the newest (`tiers.record`)."""
        self.local.wait()
        if step is not None:
            return self._restore_chosen(state, step, keep_copy)
        choice = self._local_choice(keep_copy)
        if choice is None:
            self.persister.wait_open()
            tiers = (Tier("local", self.local_dir, self.local.storage), Tier("persistent", self.directory, self.storage))
            choice = find_in_tiers(tiers, self.basename, verify=self.local.verify,
                                   unpickling=self.local.unpickling, keep_copy=keep_copy)
        if choice is None:
            return None
        restored = apply_checkpoint(choice.loaded, state, restore_rng=self.local.save_rng)
        self.local.mark_restored(restored.global_step)
        local_newest = choice.newest.get("local")
        # From the logdir while the local tier had nothing (a replaced node) or only damage: the
        # steps since the logdir's copy are lost, a WARNING; the usual cases are INFO.
        degraded = choice.tier.name == "persistent" and (local_newest is None or local_newest > restored.global_step)
        logger.log(logging.WARNING if degraded else logging.INFO, "%s", describe(choice))
        return restored

    def _local_choice(self, keep_copy: bool) -> TierChoice | None:
        """The local tier's newest verified checkpoint when it is the newest of either tier by what
        is known of the logdir without waiting for it (its open, or the local record); else None."""
        with self._mutex:
            known, newest = self._logdir_known, self._logdir_newest
        if not known:
            known, newest = read_record(self.local.storage, self.local_dir, self.directory)
        if not known:
            return None
        try:
            choice = find_in_tiers((Tier("local", self.local_dir, self.local.storage),), self.basename,
                                   verify=self.local.verify, unpickling=self.local.unpickling,
                                   keep_copy=keep_copy)
        except CheckpointCorruptError:
            return None  # nothing local verifies: the logdir decides (the warnings named each)
        if choice is None or (newest is not None and choice.loaded.step < newest):
            return None
        with self._mutex:  # the logdir's open checks this step (_logdir_opened) unless it already ran
            self._fast_step = choice.loaded.step
            if self._logdir_known and self._logdir_newest is not None and self._logdir_newest > choice.loaded.step:
                self._fast_step = None
                return None
        return TierChoice(choice.loaded, choice.tier, {"local": choice.loaded.step, "persistent": newest})

    def _restore_chosen(self, state: TrainingState, step: Any, keep_copy: bool) -> Restored | None:
        if isinstance(step, int) and os.path.isdir(self.local.path_of(step)):
            return self.local.restore(state, step=step, keep_copy=keep_copy)
        self.persister.wait_open()
        loaded = load_chosen(self.directory, self.basename, step, verify=self.local.verify, storage=self.storage,
                             unpickling=self.local.unpickling, keep_copy=keep_copy)
        restored = apply_checkpoint(loaded, state, restore_rng=self.local.save_rng)
        self.local.mark_restored(restored.global_step)
        return restored

    def __repr__(self) -> str:
        return (f"TieredCheckpointManager({self.directory!r}, local_dir={self.local_dir!r}, "
                f"persist_every_steps={self.persister.every_steps}, persist_every_secs={self.persister.every_secs})")


def make_manager(directory: str | os.PathLike, *, local_dir: str | None = None, persist_every_steps: int | None = None,
                 persist_every_secs: float | None = None, local_max_to_keep: int | None = 2,
                 persist_grace_secs: float | None = 120.0, basename: str = "model.ckpt", max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = 10000.0, save_mode: str = "async",
                 trusted_globals: Iterable[Any] = (), capture: str = "auto", lock: str = "auto",
                 lease_secs: float | None = None, keep_best: int | None = None, best_metric: Any = None,
                 best_mode: str = "min", keep_period: int | None = None, clock: Clock | None = None,
                 checkpoint_format: str = "torch") -> CheckpointManager | TieredCheckpointManager:
    """A `TieredCheckpointManager` when ``local_dir`` is given, else a `CheckpointManager`: the
    front doors' one call (their `CheckpointOptions`, the tier options checked by
    `tier_options.check_tiers`); every keyword is the managers' own, passed on by name."""
    if local_dir is None:
        return CheckpointManager(
            directory, basename=basename, max_to_keep=max_to_keep, save_mode=save_mode, capture=capture,
            keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, trusted_globals=trusted_globals, lock=lock,
            lease_secs=lease_secs, keep_best=keep_best, best_metric=best_metric, best_mode=best_mode,
            keep_period=keep_period, clock=clock, checkpoint_format=checkpoint_format)
    return TieredCheckpointManager(
        directory, local_dir=local_dir, persist_every_steps=persist_every_steps, persist_every_secs=persist_every_secs,
        local_max_to_keep=local_max_to_keep, persist_grace_secs=persist_grace_secs, basename=basename,
        max_to_keep=max_to_keep, save_mode=save_mode, capture=capture, trusted_globals=trusted_globals, lock=lock,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, lease_secs=lease_secs, keep_best=keep_best,
        best_metric=best_metric, best_mode=best_mode, keep_period=keep_period, clock=clock,
        checkpoint_format=checkpoint_format)
