"""`CheckpointManager`: save, restore and retain the checkpoints of one logdir (SPEC §5).

The one object the session, the front doors and the checkpoint hook talk to. It composes the subpackages
(docs/architecture.md): the ownership lock (``ownership/``), the capture into reused staging buffers (``save/``,
on the caller's thread — the only part that blocks training), the background writer running the commit
protocol and publishing the index and retention (``save/``), verify-then-fall-back restore (``load/``). Every
file goes through the logdir's `Storage` (``self.storage``): a local path or an ``s3://bucket/prefix`` URL.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import torch

from supervisor import distributed
from supervisor.distributed import rng as distributed_rng
from supervisor._validate import check_bool, check_callable, check_choice, check_int, check_lock
from supervisor.checkpoint.save.commit import write_checkpoint
from supervisor.checkpoint.storage.fileio import Opener
from supervisor.checkpoint.layout.format import INDEX_FILE, checkpoint_name, make_payload
from supervisor.checkpoint.layout.format_registry import writable_format
from supervisor.checkpoint.ownership.lock import WriterLock, acquire_writer_lock
from supervisor.checkpoint.save.publish import Publisher
from supervisor.checkpoint.save.failure_policy import failure_verdict
from supervisor.checkpoint.storage import Storage, is_url, resolve_location
from supervisor.checkpoint.arguments import check_basename, check_capture, check_directory, writer_storage
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.load.choose import load_chosen, find_and_load
from supervisor.checkpoint.layout.verify import VERIFY_MODES
from supervisor.checkpoint.load.apply import Restored, apply_checkpoint
from supervisor.checkpoint.save import overlap
from supervisor.checkpoint.save.overlap import Copier, PendingCopy, check_copier, discarded_message
from supervisor.checkpoint.save.staging import StagingArea
from supervisor.checkpoint.save.background import BackgroundWriter
from supervisor.checkpoint.save.in_flight import ManagerCommon, before_commit
from supervisor.checkpoint.layout.best import MetricKeeper, ReportsMetrics, check_retention
from supervisor.clock import Clock, resolve_clock
from supervisor.errors import CheckpointError
from supervisor.state.resume import loader_generators
from supervisor.state.rng import capture_rng_state
from supervisor.state import TrainingState

__all__ = ["CheckpointManager"]

logger = logging.getLogger(__name__)


class CheckpointManager(ReportsMetrics, ManagerCommon):
    """Writes checkpoints of a `TrainingState` into ``directory`` and restores the newest good one.

    Example::

        manager = CheckpointManager(logdir, max_to_keep=3)
        manager.open()                        # takes the logdir's ownership lock
        restored = manager.restore(state)     # None when there is no checkpoint yet
        ...
        manager.save(step, state)             # captures now, writes in the background
        manager.close()                       # finishes the save in flight, releases the lock

    Args:
        directory: the logdir (created if missing).
        basename: checkpoints are ``<basename>-<step>`` directories.
        max_to_keep, keep_checkpoint_every_n_hours: keep this many recent checkpoints (None: all), and one per hours.
        keep_best, best_metric, best_mode, keep_period: also keep the ``keep_best`` best by ``best_metric`` (a name
            or ``fn(metrics) -> float``; ``best_mode`` "min"/"max"; `report_metrics`), and forever every checkpoint
            whose step is a multiple of ``keep_period`` (`supervisor.checkpoint.layout.best`).
        save_mode: ``"async"`` (write in a background thread) or ``"sync"`` (write in ``save``).
        verify: ``"full"`` (sizes and checksums) or ``"size"`` (sizes only) before restoring.
        max_consecutive_save_failures: None (default): the first failed save is fatal. K: a
            failed save is logged and training goes on until K saves in a row have failed.
        trusted_globals: classes/functions a checkpoint may reference beyond what
            ``torch.load(weights_only=True)`` allows; only for checkpoints you trust.
        save_rng: save and restore the RNG states (Python, NumPy, torch CPU and CUDA).
        clock: injectable clock (checkpoint timestamps and retention use its ``time()``).
        on_error: ``on_error(CheckpointError)``, called from the writer thread when a background
            save fails fatally (a session wires it to ``request_stop``). Without it, the error
            is raised by the next ``save``, ``wait`` or ``close``.
        opener: ``opener(path) -> binary file`` for every file written into a checkpoint
            (default: ``open(path, "xb", buffering=0)``); the seam fault-injection tests use.
        capture: ``"overlapped"``: a background save copies the parameters the state's optimizers own and their
            state while the next step runs, and each optimizer's ``step()`` first waits for that copy (SPEC §5.9,
            overlap.py); everything else is copied at the boundary. ``"blocking"``: everything at the boundary.
            ``"auto"`` (default): blocking until the CUDA path has run on a GPU (`overlap.resolve_capture`). A save
            whose staged copy differs from the boundary's state (fingerprints: a write outside ``optimizer.step()``
            before or during the copy) is discarded with a WARNING.
        copier: the `overlap.Copier` of overlapped captures (default: a side CUDA stream, a
            side thread for CPU tensors); the seam the overlap tests use to force a slow copy.
        checkpoint_format: the registered format it writes (default ``"torch"``; `format_registry.writable_format`).
        lock: how this writer keeps others out of the logdir (SPEC §5.6, §16): ``"flock"`` (an
            OS file lock), ``"lease"`` (renewed every ``lease_secs / 3``; taken over only after it
            expired: the safe choice on NFS/Lustre, where ``flock`` may be node-local), ``"auto"``
            (default: flock locally, a lease on an object store). A second writer gets `LogdirInUseError`.
        lease_secs: how long the lease lives unrenewed (default 60 s; at least 1 s): how long a
            dead writer's logdir stays locked. A writer whose lease was lost (or went unrenewed
            for two thirds of it) fails its next save with `LeaseLostError` before committing.
            The lease runs on the wall clock, not on ``clock``.
        storage_options: for an object-store ``directory`` (``s3://bucket/prefix``), the
            client's options (`supervisor.checkpoint.storage.storage_for`: endpoint,
            credentials, ``part_size``...); None: the standard configuration (``AWS_*``
            environment, ``~/.aws``, ``FSSPEC_S3_*``). A local path takes none.

    Attributes:
        storage: the logdir's `Storage` (every file of the write path goes through it).
        on_commit: ``on_commit(step, path)``, called once a checkpoint is committed and indexed
            (from the writer thread for async saves). A session sets it to hand commits to its
            step boundary, which delivers them to listeners on the training thread.
    """

    def __init__(self, directory: str | os.PathLike, *, basename: str = "model.ckpt", max_to_keep: int | None = 5,
        keep_checkpoint_every_n_hours: float | None = 10000.0, save_mode: str = "async", verify: str = "full",
        max_consecutive_save_failures: int | None = None, trusted_globals: Iterable[Any] = (), checkpoint_format: str = "torch",
        save_rng: bool = True, clock: Clock | None = None, on_error: Callable[[CheckpointError], Any] | None = None,
        opener: Opener | None = None, capture: str = "auto", copier: Copier | None = None, lock: str = "auto",
        lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None, keep_best: int | None = None,
        best_metric: Any = None, best_mode: str = "min", keep_period: int | None = None) -> None:
        self.directory, self.basename = check_directory(directory), check_basename(basename)
        self.retention_rule = check_retention(max_to_keep=max_to_keep, keep_best=keep_best, best_metric=best_metric,
                                              keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                                              best_mode=best_mode, keep_period=keep_period)
        self.max_to_keep, self.keep_checkpoint_every_n_hours = max_to_keep, keep_checkpoint_every_n_hours
        self._metrics = MetricKeeper(best_metric)
        self.save_mode, self.verify = check_choice("save_mode", save_mode, ("async", "sync")), check_choice(
            "verify", verify, VERIFY_MODES)
        self.max_consecutive_save_failures = check_int(
            "max_consecutive_save_failures", max_consecutive_save_failures, minimum=1, allow_none=True)
        self.unpickling, self.save_rng = Unpickling(trusted_globals), check_bool("save_rng", save_rng)
        self.trusted_globals = self.unpickling.trusted_globals  # the user's part of the record
        self._clock = resolve_clock(clock)
        self.on_error, self._opener = check_callable("on_error", on_error, signature="on_error(CheckpointError)"), \
            check_callable("opener", opener, signature="opener(path) -> binary file")
        self.storage: Storage = writer_storage(resolve_location(directory, storage_options), self._opener)
        self.capture, self.checkpoint_format = check_capture(capture), writable_format(checkpoint_format).name
        self._copier = check_copier(copier)
        self._pending: PendingCopy | None = None
        self.on_commit: Callable[[int, str], Any] | None = None
        self.lock, self.lease_secs = check_lock(lock, lease_secs, self.directory, object_store=is_url(self.directory))
        self._lock: WriterLock | None = None  # taken by open()
        self._writer, self._staging, self._mutex = BackgroundWriter(), StagingArea(), threading.Lock()
        self._publisher = Publisher(self.storage, self.directory, self.basename, rule=self.retention_rule, writer=self)
        self._opened = self._closed = False
        self._last_saved_step: int | None = None
        self._last_committed_step: int | None = None
        self._consecutive_failures = 0
        self._failure: CheckpointError | None = None
        self._failure_delivered = False

    # ---------------------------------------------------------------- lifecycle
    @property
    def last_saved_step(self) -> int | None:
        """The step of the newest save committed or in flight (or restored); None before any."""
        return self._last_saved_step

    def path_of(self, step: int) -> str:  # the path the checkpoint of ``step`` is committed to
        return self.storage.join(self.directory, checkpoint_name(self.basename, step))

    @property
    def checkpoints(self) -> tuple[str, ...]:
        """Paths of the checkpoints retention manages, oldest first (after `open`)."""
        kept = self._publisher.retention
        return tuple(self.storage.join(self.directory, n) for n in (kept.names if kept is not None else ()))

    @property
    def is_open(self) -> bool:
        """Whether `open` ran and `close` has not."""
        return self._opened and not self._closed

    def open(self) -> None:
        """Takes the writer lock (`LogdirInUseError` if another writer holds it), removes
        what a crashed writer left (temp directories; manifest-less checkpoint prefixes on an
        object store) and recovers retention from the index (`publish.Publisher.open`)."""
        if self._closed:
            raise RuntimeError(f"the checkpoint manager of {self.directory} is closed; create a new one")
        if self._opened:
            return
        try:
            self.storage.makedirs(self.directory)
        except OSError as e:
            raise CheckpointError(f"cannot create the checkpoint directory {self.directory}: {e}") from e
        self._lock = acquire_writer_lock(self.storage, self.directory, kind=self.lock, lease_secs=self.lease_secs)
        try:
            self._publisher.claim()  # a paused former holder's late index write now fails (fencing.py)
            index, version = self._publisher.read_trusted_index()  # once per open: fixed cost of every session creation
            self._publisher.open(index, self._clock.time(), index_version=version)
        except BaseException:
            self._release_lock()
            raise
        self._opened = True

    def check_writer(self) -> None:
        """Raises `LeaseLostError` when this writer lost the logdir's lease (called right before
        each commit, so a writer that lost it never commits); a no-op under a flock."""
        if self._lock is not None:
            self._lock.check()

    def writer_generation(self) -> int | None:
        """The lease generation held (None: a flock, or not open): fences late writes (fencing.py)."""
        return getattr(self._lock, "generation", None)

    def _release_lock(self) -> None:
        if self._lock is not None:  # kept after release: ``held`` says it was released
            self._lock.release()

    def close(self, *, failed: bool = False) -> None:
        """Finishes the save in flight, stops the writer thread and releases the lock.

        ``failed=False`` re-raises a fatal background failure that was not raised on a caller's
        thread yet — also one handed to ``on_error``: a clean close means nothing acted on it
        (e.g. the session had already stopped for another reason). ``failed=True`` (closing
        because of another error) never raises it. Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._settle()
            self._writer.close()
        finally:
            self._staging.release()
            self._release_lock()
        failure = self._take_failure()
        if failure is None:
            return
        if not failed:
            raise failure
        if not self._failure_delivered:
            logger.warning("closing after another error; a checkpoint save had also failed: %s", failure)

    def __enter__(self) -> CheckpointManager:
        self.open()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(failed=exc is not None)

    # ---------------------------------------------------------------- saving
    def save(self, step: int, state: TrainingState, *, wait: bool = False,
             rng_states: Mapping[int, Any] | None = None) -> str:
        """Checkpoints ``state`` as of ``step``: captures it now, on this thread, then writes it
        in the background (``save_mode="async"``) or before returning (``"sync"``/``wait``).
        ``rng_states``: every rank's RNG state, as the ranks' agreement gathered them for this
        step (`supervisor.agreement.Decision.rng_states`); None: this process's only.

        Returns:
            The path the checkpoint is committed to (``<directory>/<basename>-<step>``).

        Raises:
            CheckpointError: this save failed and waited for (sync or ``wait=True``) and the
                failure policy says stop; or an earlier background failure not yet reported.
        """
        durable = self._take_durable()
        step = self._begin_save(step, state, is_open=self._opened and not self._closed, kind="checkpoint manager")
        name = checkpoint_name(self.basename, step)
        self._metrics.take(step, name)  # the metric reported for this step (report_metrics)
        timestamp, start = self._clock.time(), time.perf_counter()
        # A save the caller waits for writes the live CPU tensors: the caller is blocked until the
        # commit, so nothing changes them meanwhile (and the copy is a third of a 64 MiB save).
        payload, pending = self._capture(step, state, copy=not (wait or self.save_mode == "sync"), rng_states=rng_states)
        capture_secs = time.perf_counter() - start
        self._last_saved_step = step
        self._pending = pending
        # A waited-for save reports a fatal failure here, to its caller, never via on_error.
        outcome: list[CheckpointError] | None = [] if wait or self.save_mode == "sync" else None
        job = functools.partial(self._write, step, name, payload, timestamp, capture_secs, outcome, pending,
                                before_commit(durable, self.check_writer))
        del payload, pending
        if self.save_mode == "sync":
            job()
            self.remove_dropped()
        else:
            self._writer.submit(job, after=self.remove_dropped)
            if wait:
                self._writer.wait()
        if outcome:
            raise outcome[0]
        return self.storage.join(self.directory, name)

    def wait(self) -> None:
        """Blocks until no save is in flight; raises a fatal background failure that ``on_error``
        did not take — on every thread waiting, at every call, until the next ``save()`` starts
        (`supervisor.checkpoint.save.in_flight`)."""
        self._settle()
        self._writer.wait()
        self._raise_undelivered()

    def _capture(self, step: int, state: TrainingState, *, copy: bool = True,
                 rng_states: Mapping[int, Any] | None = None) -> tuple[dict[str, Any], PendingCopy | None]:
        """The payload, and the background copy of an overlapped capture (None: all copied)."""
        try:
            objects, keys = overlap.plan(state, self.capture) if copy else ([], frozenset())
            with self._staging.deferring(keys) as deferral:
                entries = self._staging.capture(state.state_dict(), copy_cpu=copy)
            pending = overlap.start(deferral, objects, self._copier)
            # With the generators of the state's data loaders (exact resume, supervisor/state/resume.py),
            # and every rank's state when the ranks' agreement gathered them for this step (§12).
            rng = distributed_rng.states_for_checkpoint(capture_rng_state(loader_generators(state)), rng_states) \
                if self.save_rng else None
        except Exception as e:
            raise CheckpointError(f"capturing the training state for the checkpoint of step {step} "
                                  f"failed: {type(e).__name__}: {e}") from e
        return make_payload(step, entries, rng, torch.__version__, classes=state.entry_classes()), pending

    def _write(self, step: int, name: str, payload: dict, timestamp: float, capture_secs: float,
               outcome: list[CheckpointError] | None, pending: PendingCopy | None = None,
               check: Callable[[], Any] | None = None) -> None:
        path = self.storage.join(self.directory, name)
        if pending is not None and not self._copied(step, pending, outcome):
            return
        try:
            result = write_checkpoint(self.directory, name, payload, step=step, wall_time=timestamp, storage=self.storage,
                                      world_size=distributed.world_size(), checkpoint_format=self.checkpoint_format,
                                      before_commit=check or self.check_writer, generation=self.writer_generation())
        except Exception as e:  # noqa: BLE001 - every write failure goes through the policy
            self._failed(step, f"saving the checkpoint of step {step} to {path} failed", e, outcome)
            return
        finally:
            del payload
        try:
            self.publish(name, timestamp)
        except Exception as e:  # noqa: BLE001
            self._failed(step, f"the checkpoint of step {step} was committed to {path} but the index "
                         f"{self.storage.join(self.directory, INDEX_FILE)} could not be updated", e, outcome)
            return
        with self._mutex:
            self._consecutive_failures = 0
            self._last_committed_step = step
        mib = result.nbytes / 2**20
        logger.debug("committed %s in %.2f s (%.1f MiB at %.0f MiB/s; capture took %.3f s)", name,
                    result.write_secs, mib, mib / max(result.write_secs, 1e-9), capture_secs)
        self._report_commit(step, path)

    def _copied(self, step: int, pending: PendingCopy, outcome: list[CheckpointError] | None) -> bool:
        """Waits for an overlapped capture's copy; False when the save is discarded or failed."""
        try:
            moved = pending.outcome()
        except Exception as e:  # noqa: BLE001 - the copy's failure goes through the policy
            self._failed(step, f"copying the state for the checkpoint of step {step} failed", e, outcome)
            return False
        if not moved:
            return True
        with self._mutex:
            self._last_saved_step = self._last_committed_step
        logger.warning("%s", discarded_message(step, moved))
        return False

    def publish(self, name: str, timestamp: float) -> None:
        """Index first (the new checkpoint is restorable), then retention (SPEC §5.1 steps 5–6):
        for each commit of this manager, and of the sharded manager's chief
        (`publish.Publisher.publish`)."""
        self._publisher.publish(name, timestamp, self._metrics.pop(name))

    def remove_dropped(self) -> None:
        """Deletes what retention dropped, after the save reported done (`publish.Publisher`)."""
        self._publisher.remove_dropped()

    def _failed(self, step: int, message: str, error: Exception, outcome: list[CheckpointError] | None) -> None:
        """Applies the failure policy (`save_failures.failure_verdict`): tolerate (WARNING), or
        report the fatal failure to the waiting caller (``outcome``), else to ``on_error``,
        else at the next call."""
        with self._mutex:
            self._consecutive_failures += 1
            count = self._consecutive_failures
            self._last_saved_step = self._last_committed_step
        limit = self.max_consecutive_save_failures
        failure, tolerated = failure_verdict(message, error, in_a_row=count, limit=limit)
        if tolerated:
            logger.warning("%s; the committed checkpoints are intact and training goes on "
                           "(%d of max_consecutive_save_failures=%d failures in a row)", failure, count, limit)
        elif outcome is not None:
            outcome.append(failure)
        else:
            self._deliver_failure(failure)

    # ---------------------------------------------------------------- restoring
    def restore(self, state: TrainingState, step: int | str | os.PathLike | None = None, *,
                keep_copy: bool = False) -> Restored | None:
        """Restores the newest verified checkpoint (falling back to older ones) into ``state``,
        with the RNG states; returns its step and path, or None when there is no checkpoint.
        ``step``: that step's checkpoint instead (or a checkpoint path of this directory), verified alike and never
        replaced by another (`choose.load_chosen`). ``keep_copy``: the verified bytes stay open as ``Restored.source``
        (a chief shares them). Raises `CheckpointCorruptError` (none verifies, or not the chosen one),
        `CheckpointNotFoundError` (no checkpoint of the chosen step: the steps there named) or
        `CheckpointError` (the checkpoint does not match ``state``, or needs an untrusted global)."""
        self._settle()
        self._writer.wait()  # a save in flight is the newest checkpoint
        options = {"verify": self.verify, "unpickling": self.unpickling, "storage": self.storage, "keep_copy": keep_copy}
        loaded = (find_and_load(self.directory, self.basename, **options) if step is None
                  else load_chosen(self.directory, self.basename, step, **options))
        if loaded is None:
            return None
        restored = apply_checkpoint(loaded, state, restore_rng=self.save_rng)
        self._last_saved_step = self._last_committed_step = restored.global_step
        return restored

    def __repr__(self) -> str:
        return f"CheckpointManager({self.directory!r}, basename={self.basename!r}, max_to_keep={self.max_to_keep})"
