"""Publishing committed checkpoints: the index, then retention (SPEC §5.1 steps 5–6, §5.5, §16).

`Publisher` is the part of a `CheckpointManager` that owns the logdir's index and retention,
through the logdir's `supervisor.checkpoint.storage.Storage`:

* `open` (the writer opening the logdir, under its lock/lease): checkpoints a crash left under
  transient names are put back (`commit.recover_interrupted_replacements`; locally only),
  leftovers are removed (`commit.clean_transient`: temp directories locally, manifest-less
  checkpoint prefixes on an object store, with a WARNING each), retention is rebuilt from the
  index.
* `publish` after each commit: the index is replaced only while it still is the version this
  writer read or last wrote (`index.replace_index`: ``If-Match`` on the ETag on an object
  store); a refused write (another writer moved the index) raises
  `supervisor.checkpoint.storage.PreconditionFailedError` and nothing is deleted. Only then
  does retention run, on committed checkpoints only (`commit.move_aside`, whose rule is
  `commit.deletable_problem`); what it drops is deleted later, off the save's path
  (`remove_dropped`).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Collection, Iterable

from supervisor.checkpoint.layout import fencing, retention
from supervisor.checkpoint.save.commit import clean_transient, move_aside, recover_interrupted_replacements
from supervisor.checkpoint.layout.format import INDEX_FILE
from supervisor.checkpoint.layout.index import CheckpointState, read_index, replace_index, trusted_index
from supervisor.checkpoint.ownership.lease import LeaseLostError
from supervisor.checkpoint.storage import PreconditionFailedError, Storage
from supervisor.checkpoint.save.temp import remove_tree

__all__ = ["Publisher", "indexed_names"]

logger = logging.getLogger(__name__)


class Publisher:
    """The index and retention of one writer's logdir (see the module docstring).

    Args:
        storage: the logdir's storage.
        directory: the logdir, in the storage's spelling.
        basename: checkpoints are ``<basename>-<step>``.
        max_to_keep, keep_checkpoint_every_n_hours: retention's rules (`retention.sweep`).
        rule: the whole rule instead (``keep_best``, ``keep_period``: `retention.RetentionRule`).
        writer: the manager writing (None: no lock): its ``writer_generation()`` (the lease
            generation, recorded in each index write: it fences a paused former holder,
            fencing.py) and ``check_writer()`` (raises once it lost its lease: retention then
            deletes nothing).
    """

    def __init__(self, storage: Storage, directory: str, basename: str, *, max_to_keep: int | None = 5,
                 keep_checkpoint_every_n_hours: float | None = 10000.0, writer: Any = None,
                 rule: retention.RetentionRule | None = None) -> None:
        self.storage = storage
        self.directory = directory
        self.basename = basename
        self.rule = rule if rule is not None else retention.RetentionRule(max_to_keep, keep_checkpoint_every_n_hours)
        self.max_to_keep = self.rule.max_to_keep
        self.keep_checkpoint_every_n_hours = self.rule.keep_checkpoint_every_n_hours
        self.retention: retention.RetentionState | None = None
        self._latest: str | None = None  # the newest name published
        #: The version of the index this writer read or last wrote (None: there was none).
        self.index_version: str | None = None
        self._dropped: list[str] = []
        self._mutex = threading.Lock()
        self._generation: Callable[[], int | None] = getattr(writer, "writer_generation", lambda: None)
        self._check_writer: Callable[[], None] = getattr(writer, "check_writer", lambda: None)
        #: ``hold()``: names retention must not delete yet (a checkpoint tier's copy in flight).
        self.hold: Callable[[], Collection[str]] | None = None

    def claim(self) -> None:
        """On an object store, as a writer that just took the lease: rewrites the index with its
        generation (`fencing.claim_index`), so a paused former holder's late index write fails."""
        generation = self._generation()
        if generation is not None and self.storage.is_object_store:
            fencing.claim_index(self.storage, self.directory, INDEX_FILE, generation)

    def open(self, index: CheckpointState | None, now: float, *, index_version: str | None) -> None:
        """Recovers, cleans up and rebuilds retention from ``index`` (trusted entries only);
        ``index_version``: the version of the index file as read (None: no index file)."""
        self.index_version = index_version
        recover_interrupted_replacements(self.directory, indexed_names(index), self.storage)
        clean_transient(self.directory, self.storage, self.basename)
        present = set(self.storage.listdir(self.directory))
        self.retention = retention.recover(index, now, present=present, best_metric=self.rule.best_metric,
                                           keep_period=self.rule.keep_period)
        self._latest = index.model_checkpoint_path if index is not None else None
        if index is not None:
            gone = [p for p in index.all_model_checkpoint_paths if p not in present]
            if gone:
                logger.debug("the checkpoint index lists %s, which no longer exist(s); forgetting them", gone)

    def read_trusted_index(self) -> tuple[CheckpointState | None, str | None]:
        """The index with only entries that name checkpoints of this logdir (`trusted_index`
        warns about each other entry), None when there is none or it cannot be read; and the
        version of the index file it read (what the next index write must still find)."""
        try:
            index = read_index(self.directory, storage=self.storage)
        except (ValueError, OSError) as e:
            logger.warning("%s; retention starts afresh and will not delete the checkpoints it lists", e)
            return None, self.index_version_now()
        if index is None:  # none, or only a lease holder's claim (fencing.claim_index), whose version counts
            return None, self.index_version_now()
        return trusted_index(index, self.directory, self.basename, warn=True)[0], index.version

    def index_version_now(self) -> str | None:
        """The version of the index file as it is now (for an index that could not be read:
        a writer still replaces it only while it is that file); None when there is none."""
        try:
            return self.storage.stat(self.storage.join(self.directory, INDEX_FILE)).version
        except FileNotFoundError:
            return None

    def publish(self, name: str, timestamp: float, metric: float | None = None) -> None:
        """Index first (the new checkpoint is restorable, with its ``metric``), then retention.

        Raises:
            PreconditionFailedError: another writer replaced the index since this one read or
                wrote it; nothing was written or deleted.
            OSError: the index could not be written.
        """
        recorded = retention.with_metric(retention.record(self.retention, name, timestamp), name, metric)
        self._write_index(retention.to_index(recorded, name, self.rule))
        self.retention, self._latest = recorded, name
        self._retain_safely(name)

    def record_metric(self, name: str, metric: float) -> bool:
        """Records the ``metric`` of the committed checkpoint ``name`` that arrived after its
        commit (an evaluation at the end, after the final save), then applies retention; the
        caller makes sure no save is being published meanwhile. False when ``name`` is not
        managed (deleted already, or never published by this writer)."""
        if self.retention is None or name not in self.retention.names or self._latest is None:
            return False
        recorded = retention.with_metric(self.retention, name, metric)
        self._write_index(retention.to_index(recorded, self._latest, self.rule))
        self.retention = recorded
        self._retain_safely(self._latest)
        return True

    def retain_again(self) -> None:
        """Applies retention once more without a new checkpoint (what ``hold()`` held may be
        free now: a checkpoint tier's copies ended), then deletes what it dropped."""
        if self.retention is not None and self._latest is not None:
            self._retain_safely(self._latest)
            self.remove_dropped()

    def _retain_safely(self, name: str) -> None:
        try:
            self._retain(name)
        except PreconditionFailedError:
            raise
        except OSError as e:  # the new checkpoint is committed and published: only cleanup failed
            logger.warning("retention after committing %s failed (%s); older checkpoints may be left "
                           "behind", name, e)

    def _write_index(self, state: CheckpointState) -> None:
        generation = self._generation()
        try:
            written = replace_index(self.directory, state, storage=self.storage, version=self.index_version,
                                    generation=generation)
        except PreconditionFailedError:
            # A paused former holder's late write (its lease generation is older): replace it.
            older = fencing.older_index_version(self.storage, self.directory, INDEX_FILE, generation)
            if older is None:
                raise
            written = replace_index(self.directory, state, storage=self.storage, version=older,
                                    generation=generation)
        self.index_version = written.version

    def _retain(self, latest: str) -> None:
        result = self.rule.sweep(self.retention)
        if self.hold is not None and result.delete:
            result = retention.hold(result, self.retention, self.hold())
        if not (result.delete or result.preserve):
            return
        if result.delete:
            try:
                self._check_writer()  # a writer that lost the lease deletes nothing
            except LeaseLostError as e:
                logger.warning("retention deletes nothing: %s", e)
                return
        for kept in result.preserve:
            logger.debug("keeping %s for good (one checkpoint every %g hours)", kept,
                        self.keep_checkpoint_every_n_hours)
        # Uncommit before the index forgets them, delete after: a crash in between leaves
        # .deleting- directories / manifest-less prefixes (removed at the next open), never a
        # listed half-deleted checkpoint.
        asides = [a for a in (move_aside(self.storage.join(self.directory, n), storage=self.storage)
                              for n in result.delete) if a]
        self._write_index(retention.to_index(result.state, latest, self.rule))
        self.retention = result.state
        with self._mutex:
            self._dropped.extend(asides)
        if result.delete:
            logger.debug("retention deleted %s (max_to_keep=%s)", ", ".join(result.delete), self.max_to_keep)

    def remove_dropped(self) -> None:
        """Deletes what retention uncommitted. It runs after the save reported done, so neither
        a wait nor the next capture waits for the storage work (0.2–0.3 s per GiB locally); a
        crash meanwhile leaves remains the next `open` removes."""
        with self._mutex:
            dropped, self._dropped = self._dropped, []
        for aside in dropped:
            remove_tree(aside, self.storage)


def indexed_names(index: CheckpointState | None) -> Iterable[str]:
    """The checkpoint names a (trusted) index lists."""
    if index is None:
        return []
    return [n for n in (index.model_checkpoint_path, *index.all_model_checkpoint_paths) if n]
