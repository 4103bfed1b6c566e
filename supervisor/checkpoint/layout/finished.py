"""The "training finished" mark: how a trainer tells evaluators the run is over (SPEC §10.2).

The file ``logdir/.supervisor.finished`` exists exactly when the last training session on the
log directory ended cleanly: its ``with`` block exited without an error and the stop was not
caused by SIGTERM/SIGINT (a preempted run is not finished: it will resume). It is

- written by the chief's session creator at close, after the final checkpoint is committed,
  atomically through the logdir's storage (locally: temp file, fsync, ``os.replace``, fsync of
  the directory; on an object store: one ``PutObject``);
- removed when a new training session starts on the log directory (at its restore, while it
  holds the ownership lock), so a resumed run is "not finished" again;
- read by evaluators (`supervisor.estimator.evaluation.EvaluationLoop`): once it exists and
  nothing newer than the last evaluated checkpoint is left, the evaluator stops — after
  evaluating the final checkpoint. TF's evaluator never exited when ``max_steps`` was None.

Its content is one JSON object, for people and scripts::

    {"step": 1200, "checkpoint": "model.ckpt-1200", "wall_time": 1763700000.5,
     "host": "node-3", "pid": 4242}

``step`` is the session's final global step, ``checkpoint`` the newest checkpoint's name (or
null when the run saved none). Only the file's existence carries meaning to the evaluator; a
damaged file still counts as "finished" (with a WARNING). Deleting it by hand is harmless.
"""
from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from supervisor.checkpoint.storage.records import fields, parse_object
from supervisor.checkpoint.storage import Storage, storage_for
from supervisor.clock import Clock, resolve_clock

__all__ = ["FINISHED_FILE", "FinishedMark", "clear_finished", "mark_finished", "read_finished"]

logger = logging.getLogger(__name__)

FINISHED_FILE = ".supervisor.finished"
_MARK_MAX_BYTES = 1 << 16  # a few fields: a larger file is damaged, never read whole


@dataclass(frozen=True)
class FinishedMark:
    """What the finished file says (None fields when it is damaged or hand-made)."""

    step: int | None = None
    checkpoint: str | None = None
    wall_time: float | None = None
    host: str | None = None
    pid: int | None = None


def finished_path(logdir: str | os.PathLike, storage: Storage | None = None) -> str:
    logdir = os.fspath(logdir)
    return (storage if storage is not None else storage_for(logdir)).join(logdir, FINISHED_FILE)


def mark_finished(logdir: str | os.PathLike, *, step: int | None, checkpoint: str | None = None,
                  clock: Clock | None = None, storage: Storage | None = None) -> str:
    """Atomically writes the finished file; returns its path.

    Args:
        logdir: the log directory (must exist).
        step: the final global step.
        checkpoint: the newest checkpoint's path or name (stored as its name), or None.
        clock: injectable clock (for ``wall_time``).
        storage: the logdir's storage (default: `storage_for(logdir)`).
    """
    storage = storage if storage is not None else storage_for(os.fspath(logdir))
    path = finished_path(logdir, storage)
    record = {"step": step, "checkpoint": storage.basename(os.fspath(checkpoint)) if checkpoint else None,
              "wall_time": resolve_clock(clock).time(), "host": socket.gethostname(), "pid": os.getpid()}
    storage.write_atomic(path, (json.dumps(record, sort_keys=True) + "\n").encode("utf-8"))
    logger.debug("marked the run in %s finished at step %s", os.fspath(logdir), step)
    return path


def clear_finished(logdir: str | os.PathLike, storage: Storage | None = None) -> bool:
    """Removes the finished file (a new training session starts); True if there was one. Made
    durable locally (fsync of the logdir); on an object store the delete is."""
    storage = storage if storage is not None else storage_for(os.fspath(logdir))
    if not storage.remove(finished_path(logdir, storage)):
        return False
    storage.sync_dir(os.fspath(logdir))
    logger.debug("a new training session starts in %s: removed its finished mark", os.fspath(logdir))
    return True


def read_finished(logdir: str | os.PathLike, storage: Storage | None = None) -> FinishedMark | None:
    """The finished mark of ``logdir``, or None while the run is not finished."""
    storage = storage if storage is not None else storage_for(os.fspath(logdir))
    path = finished_path(logdir, storage)
    try:
        data = storage.read_bytes(path, max_bytes=_MARK_MAX_BYTES)  # regular files only: a FIFO is refused
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("%s cannot be read (%s); treating the run as finished", path, e)
        return FinishedMark()
    try:  # untrusted: supervisor.checkpoint.storage.records
        record = parse_object(data)
        return fields(lambda: FinishedMark(
            step=_opt(record.get("step"), int), checkpoint=_opt(record.get("checkpoint"), str),
            wall_time=_opt(record.get("wall_time"), float), host=_opt(record.get("host"), str),
            pid=_opt(record.get("pid"), int)), "finished mark")
    except ValueError as e:
        logger.warning("%s is damaged (%s); treating the run as finished", path, e)
        return FinishedMark()


def _opt(value: Any, kind: type) -> Any:
    """``value`` as a ``kind`` (None stays None); `TypeError` for a value of another type."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise TypeError(f"expected {'a number' if kind is float else kind.__name__}, got {value!r:.40}")
    return kind(value)
