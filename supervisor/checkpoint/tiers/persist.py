"""The persist worker of checkpoint tiers (SPEC §17): local commits copied to the logdir.

`Persister` owns the logdir's side of a tiered manager: its single-writer lock (flock, or the
lease on an object store), its index and retention (`supervisor.checkpoint.save.publish.Publisher`,
``max_to_keep`` of the logdir), and one resident background thread. After each local commit the
local writer thread calls `offer`; when the schedule says the checkpoint is due (`is_due`:
``every_steps`` training steps, or ``every_secs`` seconds, since the last one scheduled; the
first one always) it becomes the pending copy — a newer due checkpoint replaces a pending one
not started yet, so the copies never queue up. With ``keep_best``/``keep_period`` (the logdir's
`RetentionRule`) a checkpoint the logdir's retention would keep — its metric among the best
``keep_best`` of the logdir's and the pending ones, or its step a multiple of ``keep_period`` — is
copied even when not due, and a newer save never replaces it (`keeps`); its metric is published
with it into the logdir's index. The thread copies it (`tier_copy.persist_copy`:
from the committed local files, verified on arrival, committed with the logdir's protocol),
publishes it in the logdir's index, then runs the logdir's retention.

`held` names the local checkpoints pending or being copied: the local tier's retention keeps
them until their copy is done. Training never waits for a copy; only `close` does, for at most
its ``grace_secs``, and says in a WARNING what was not persisted.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from supervisor.checkpoint.layout.format import step_of
from supervisor.checkpoint.layout.retention import RetentionRule, RetentionState, best_names
from supervisor.checkpoint.ownership.lock import WriterLock, acquire_writer_lock
from supervisor.checkpoint.save.publish import Publisher
from supervisor.checkpoint.save.failure_policy import failure_verdict
from supervisor.checkpoint.storage import Storage
from supervisor.checkpoint.tiers.copy import persist_copy
from supervisor.clock import Clock
from supervisor.errors import CheckpointError

__all__ = ["Persister", "is_due"]

logger = logging.getLogger(__name__)


def is_due(step: int, now: float, *, last_step: int | None, last_time: float, every_steps: int | None,
           every_secs: float | None) -> bool:
    """Whether the local checkpoint of ``step``, committed at ``now``, is to be persisted: the
    first one always, then one ``every_steps`` steps or ``every_secs`` seconds after the last one
    scheduled (``last_step`` at ``last_time``). Pure: the schedule's table test drives it."""
    if last_step is None:
        return True
    if step <= last_step:
        return False
    if every_steps is not None:
        return step - last_step >= every_steps
    return every_secs is not None and now - last_time >= every_secs


@dataclass
class CopyJob:
    """A local checkpoint to copy: ``metric`` goes into the logdir's index with it; ``kept``: the
    logdir's retention keeps it (best or period), so no newer save replaces it."""

    step: int
    path: str
    metric: float | None = None
    kept: bool = False


class Persister:
    """Copies due local checkpoints into the logdir in the background (module docstring).

    Args:
        directory, storage, basename: the logdir, its storage, the checkpoints' basename.
        max_to_keep, keep_checkpoint_every_n_hours: the logdir's retention.
        rule: the logdir's whole retention rule instead (``keep_best``, ``keep_period``).
        lock, lease_secs: the logdir's single-writer lock (`acquire_writer_lock`).
        every_steps, every_secs: the schedule (`is_due`); one of them.
        clock: the schedule's and the index timestamps' clock.
        source_storage: the local tier's storage.
        max_consecutive_failures: None: the first failed copy is fatal; K: tolerated (WARNING)
            until K copies in a row failed.
        on_failure: ``on_failure(CheckpointError)``, called from the worker for a fatal failure.
    """

    def __init__(self, directory: str, storage: Storage, *, basename: str, max_to_keep: int | None,
                 keep_checkpoint_every_n_hours: float | None, lock: str, lease_secs: float | None,
                 every_steps: int | None, every_secs: float | None, clock: Clock, source_storage: Storage,
                 max_consecutive_failures: int | None, on_failure: Callable[[CheckpointError], Any],
                 rule: RetentionRule | None = None) -> None:
        self.directory, self.storage, self.basename = directory, storage, basename
        self.every_steps, self.every_secs = every_steps, every_secs
        self._lock_kind, self._lease_secs = lock, lease_secs
        self._clock, self._source_storage = clock, source_storage
        self._limit, self._on_failure = max_consecutive_failures, on_failure
        self.publisher = Publisher(storage, directory, basename, max_to_keep=max_to_keep,
                                   keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours, writer=self, rule=rule)
        self._lock: WriterLock | None = None
        self._cond = threading.Condition()
        self._pending: list[CopyJob] = []  # not started yet, oldest first
        self._copying: CopyJob | None = None
        self._closing = self._cancelled = False
        self._thread: threading.Thread | None = None
        self._failures_in_a_row = 0
        #: The newest step the logdir holds (opened, or persisted since); None: none yet.
        self.persisted_step: int | None = None
        self._scheduled: tuple[int | None, float] = (None, 0.0)  # (step, time) of the last one scheduled
        self._forced = False  # the pending copy was forced (close, persist) rather than due
        self._go = True  # the worker may open the logdir (`open(deferred=True)`: once `open_now`)
        self._opened = threading.Event()  # set once the worker's open ended (see _open_error)
        self._open_error: CheckpointError | None = None
        self._on_open: Callable[[int | None], Any] | None = None
        #: ``on_persisted(step)``: the logdir's newest step after each copy published (worker thread).
        self.on_persisted: Callable[[int], Any] | None = None

    # ------------------------------------------------------------ lifecycle
    def open(self, on_open: Callable[[int | None], Any] | None = None, *, deferred: bool = False) -> None:
        """Starts the worker, which first opens the logdir (`_open_logdir`: its writer lock,
        cleanup and index) off the caller's thread, then calls ``on_open(persisted_step)``, then
        copies: nothing is persisted before the lock is held. A failure to open goes to
        ``on_failure`` (fatal) and the worker ends; `wait_open` waits for the outcome.
        ``deferred``: the worker opens the logdir only at `open_now` — called by `wait_open` (a
        restore that needs the logdir), by the first `offer` that queues a copy, or by the caller
        (a session after its first step) — and ends without opening it when `close` comes first."""
        self._on_open, self._go = on_open, not deferred
        self._thread = threading.Thread(target=self._run, name="supervisor-checkpoint-persist", daemon=True)
        self._thread.start()

    def open_now(self) -> None:
        """Lets a deferred worker open the logdir now (in the background); no-op once it may."""
        with self._cond:
            if not self._go:
                self._go = True
                self._cond.notify_all()

    def wait_open(self, timeout_secs: float | None = None) -> None:
        """Opens the logdir now if its open was deferred (`open_now`) and waits until the worker
        opened it; raises what made the open fail, or `CheckpointError` when ``timeout_secs`` ran
        out first."""
        self.open_now()
        if not self._opened.wait(timeout_secs):
            raise CheckpointError(f"opening the logdir {self.directory} (its writer lock and index) did not finish "
                                  f"within {timeout_secs} s; check that the store is reachable")
        if self._open_error is not None:
            raise self._open_error

    @property
    def is_open(self) -> bool:
        """Whether the worker holds the logdir's writer lock and read its index."""
        return self._opened.is_set() and self._open_error is None

    def _open_logdir(self) -> None:
        """Takes the logdir's writer lock, cleans and recovers it (`Publisher.open`)."""
        self.storage.makedirs(self.directory)
        lock = acquire_writer_lock(self.storage, self.directory, kind=self._lock_kind, lease_secs=self._lease_secs)
        self._lock = lock
        try:
            self.publisher.claim()
            index, version = self.publisher.read_trusted_index()
            self.publisher.open(index, self._clock.time(), index_version=version)
        except BaseException:
            lock.release()
            raise
        names = self.publisher.retention.names if self.publisher.retention is not None else ()
        steps = [s for s in (step_of(n, self.basename) for n in names) if s is not None]
        self.persisted_step = max(steps, default=None)
        now = self._clock.time()
        with self._cond:  # a save offered before the logdir was open is due against the logdir's step
            self._scheduled, last = (self.persisted_step, now), self._pending[-1:]
            self._pending = [job for job in self._pending if (self.persisted_step is None or job.step > self.persisted_step)
                             and (job.kept or (self._forced and job in last) or is_due(
                                 job.step, now, last_step=self.persisted_step, last_time=now,
                                 every_steps=self.every_steps, every_secs=self.every_secs))]
            if self._pending:
                self._scheduled = (self._pending[-1].step, now)

    def _start_worker(self) -> bool:
        """The worker's first part: opens the logdir and hands its newest step to ``on_open``;
        False (the failure reported) when either failed."""
        try:
            self._open_logdir()
            if self._on_open is not None:
                self._on_open(self.persisted_step)
            with self._cond:
                closed = self._cancelled
            if closed:  # close gave up waiting while the logdir was opened: nothing more is copied
                self._lock.release()
                self._opened.set()
                return False
        except Exception as e:  # noqa: BLE001 - reported through on_failure, raised by wait_open
            if self._lock is not None:
                self._lock.release()
            self._open_error = e if isinstance(e, CheckpointError) else CheckpointError(
                f"opening the logdir {self.directory} failed: {e}")
            self._open_error.__cause__ = e if self._open_error is not e else e.__cause__
            with self._cond:
                self._pending, self._cancelled = [], True
                self._cond.notify_all()
            self._opened.set()
            self._on_failure(self._open_error)
            return False
        self._opened.set()
        return True

    def check_writer(self) -> None:
        """Raises `LeaseLostError` once the logdir's lease is lost, or the copy was abandoned at close."""
        if self._cancelled:
            raise CheckpointError(f"the copy to {self.directory} was abandoned when the session closed")
        if self._lock is not None:
            self._lock.check()

    def writer_generation(self) -> int | None:
        return getattr(self._lock, "generation", None)

    def close(self, grace_secs: float | None) -> None:
        """Waits up to ``grace_secs`` (None: without bound) for the copy in flight and the pending
        one, then stops the worker and releases the lock; what was not persisted is said in a
        WARNING (it stays in the local tier, which a resume on this node restores)."""
        done = self.flush(grace_secs)
        with self._cond:
            left = [(job.step, job.path) for job in self._jobs()]
            self._closing, self._pending = True, []
            self._cancelled = not done
            self._cond.notify_all()
        if not done:
            logger.warning("the checkpoint(s) of step %s were not persisted to %s within persist_grace_secs=%s; "
                           "they stay in the local tier (%s), which a resume on this node restores; elsewhere "
                           "the job resumes from the logdir's step %s", ", ".join(str(s) for s, _ in left),
                           self.directory, grace_secs, ", ".join(p for _, p in left), self.persisted_step)
        elif self._thread is not None:
            self._thread.join(timeout=60)
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------ the schedule
    def offer(self, step: int, path: str, *, force: bool = False, metric: float | None = None) -> bool:
        """A local commit of ``step`` at ``path`` (its ``metric``: None when none): makes it the
        pending copy when due (or ``force``: the final checkpoint, unless persisted already), or
        queues it when the logdir's retention would keep it (`keeps`); returns whether it did."""
        now = self._clock.time()
        with self._cond:
            last_step, last_time = self._scheduled
            due = is_due(step, now, last_step=last_step, last_time=last_time, every_steps=self.every_steps,
                         every_secs=self.every_secs) or (force and (last_step is None or step > last_step))
            newest = max([j.step for j in self._jobs()] + [self.persisted_step or -1])
            kept = self.keeps(step, self._source_storage.basename(path), metric)
            if not (due or kept) or step <= newest or self._closing or self._open_error is not None:
                return False
            if due:
                for job in [j for j in self._pending if not j.kept]:
                    logger.debug("the copy of step %d to %s is replaced by step %d before it started", job.step,
                                 self.directory, step)
                self._pending = [j for j in self._pending if j.kept]
                self._scheduled, self._forced = (step, now), force
            self._pending.append(CopyJob(step, path, metric, kept))
            self._go = True  # a copy needs the logdir's lock: a deferred open starts now
            self._cond.notify_all()
        return True

    def keeps(self, step: int, name: str, metric: float | None) -> bool:
        """Whether the logdir's retention would keep the checkpoint ``name`` of ``step`` with
        ``metric``: its step a multiple of ``keep_period``, or its metric among the best
        ``keep_best`` of the logdir's and the pending copies' (a tie keeps the older)."""
        rule = self.publisher.rule
        if rule.keep_period and step % rule.keep_period == 0:
            return True
        if not rule.keep_best or metric is None:
            return False
        state = self.publisher.retention
        metrics = dict(state.metrics) if state is not None else {}
        with self._cond:
            metrics.update({self._source_storage.basename(j.path): j.metric for j in self._jobs() if j.metric is not None})
        metrics[name] = metric
        names = [n for n in (state.names if state is not None else ()) if n in metrics]
        names += [n for n in metrics if n not in names and n != name] + [name]
        return name in best_names(RetentionState(tuple((n, 0.0) for n in names), 0.0, metrics), rule.keep_best,
                                  rule.best_mode)

    def record_metric(self, step: int, name: str, metric: float) -> bool:
        """A metric reported after the local commit of ``step`` (an evaluation at the end): given
        to its pending copy, or recorded in the logdir's index when it is there (once the logdir is
        open and the copy in flight is published); False when neither (the caller may `offer` it)."""
        with self._cond:
            for job in self._pending:
                if job.step == step:
                    job.metric, job.kept = metric, job.kept or self.keeps(step, name, metric)
                    return True
        try:
            self.wait_open()  # the logdir's index is needed: a deferred open starts now
        except CheckpointError:
            return False  # reported through on_failure
        self.flush()
        if self.publisher.record_metric(name, metric):
            self.publisher.remove_dropped()
            return True
        return False

    def _jobs(self) -> list[CopyJob]:
        """The copy in flight and the pending ones, oldest first (under ``_cond``)."""
        return ([self._copying] if self._copying is not None else []) + self._pending

    def held(self) -> set[str]:
        """Names of the local checkpoints pending or being copied (local retention keeps them)."""
        with self._cond:
            return {self._source_storage.basename(job.path) for job in self._jobs()}

    def flush(self, timeout_secs: float | None = None) -> bool:
        """Waits until nothing is pending or being copied; False when ``timeout_secs`` ran out."""
        deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
        with self._cond:
            while self._pending or self._copying is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # ------------------------------------------------------------ the worker
    def _wait_to_open(self) -> bool:
        """A deferred open (`open`) waits for `open_now`; False when `close` came first (the
        logdir never opened: `wait_open` then raises, `is_open` is False)."""
        with self._cond:
            if not self._go:
                logger.debug("the persist worker waits to open the logdir %s until a copy, a restore or the "
                             "session's first step needs it", self.directory)
            while not self._go and not self._closing:
                self._cond.wait()
            if self._go:
                return True
            self._open_error = CheckpointError(f"the logdir {self.directory} was not opened: the session closed "
                                               "before anything needed it")
        self._opened.set()
        return False

    def _run(self) -> None:
        if not self._wait_to_open() or not self._start_worker():
            return
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                self._copying = job = self._pending.pop(0)
            try:
                self._persist(job.step, job.path, job.metric)
            finally:
                with self._cond:
                    self._copying = None
                    self._cond.notify_all()

    def _persist(self, step: int, path: str, metric: float | None = None) -> None:
        name = self._source_storage.basename(path)
        start = time.perf_counter()
        try:
            result = persist_copy(path, self._source_storage, self.directory, name, self.storage,
                                  generation=self.writer_generation(), before_commit=self.check_writer)
            self.publisher.publish(name, result.manifest.wall_time, metric)
            self.publisher.remove_dropped()
        except Exception as e:  # noqa: BLE001 - every copy failure goes through the policy
            self._failed(step, path, e)
            return
        self._failures_in_a_row = 0
        self.persisted_step = max(step, self.persisted_step or 0)
        if self.on_persisted is not None:
            self.on_persisted(self.persisted_step)
        mib = result.nbytes / 2**20
        logger.debug("persisted step %d to %s (%.1f MiB in %.2f s)", step, result.path, mib,
                     time.perf_counter() - start)

    def _failed(self, step: int, path: str, error: Exception) -> None:
        self._failures_in_a_row += 1
        failure, tolerated = failure_verdict(
            f"persisting the checkpoint of step {step} from {path} to {self.directory} failed", error,
            in_a_row=self._failures_in_a_row, limit=self._limit)
        if self._cancelled:
            logger.debug("%s", failure)
        elif tolerated:
            logger.warning("%s; it stays in the local tier and the next due checkpoint is persisted instead "
                           "(%d of max_consecutive_save_failures=%d failures in a row)", failure,
                           self._failures_in_a_row, self._limit)
        else:
            self._on_failure(failure)
