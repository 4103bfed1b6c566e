"""The "training finished" mark: how a trainer tells evaluators the run is over (SPEC §10.2).

The file ``logdir/.supervisor.finished`` exists exactly when the last training session on the
log directory ended cleanly: its ``with`` block exited without an error and the stop was not
caused by SIGTERM/SIGINT (a preempted run is not finished: it will resume). It is

- written by the chief's session creator at close, after the final checkpoint is committed,
  atomically (temp file, fsync, ``os.replace``, fsync of the directory);
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

from supervisor.checkpoint.fileio import atomic_write_text, fsync_dir, open_regular_file
from supervisor.clock import Clock, resolve_clock

__all__ = ["FINISHED_FILE", "FinishedMark", "clear_finished", "mark_finished", "read_finished"]

logger = logging.getLogger(__name__)

FINISHED_FILE = ".supervisor.finished"


@dataclass(frozen=True)
class FinishedMark:
    """What the finished file says (None fields when it is damaged or hand-made)."""

    step: int | None = None
    checkpoint: str | None = None
    wall_time: float | None = None
    host: str | None = None
    pid: int | None = None


def finished_path(logdir: str | os.PathLike) -> str:
    return os.path.join(os.fspath(logdir), FINISHED_FILE)


def mark_finished(logdir: str | os.PathLike, *, step: int | None, checkpoint: str | None = None,
                  clock: Clock | None = None) -> str:
    """Atomically writes the finished file; returns its path.

    Args:
        logdir: the log directory (must exist).
        step: the final global step.
        checkpoint: the newest checkpoint's path or name (stored as its name), or None.
        clock: injectable clock (for ``wall_time``).
    """
    path = finished_path(logdir)
    record = {"step": step, "checkpoint": os.path.basename(os.fspath(checkpoint)) if checkpoint else None,
              "wall_time": resolve_clock(clock).time(), "host": socket.gethostname(), "pid": os.getpid()}
    atomic_write_text(path, json.dumps(record, sort_keys=True) + "\n")
    logger.info("marked the run in %s finished at step %s", os.fspath(logdir), step)
    return path


def clear_finished(logdir: str | os.PathLike) -> bool:
    """Removes the finished file (a new training session starts); True if there was one."""
    try:
        os.remove(finished_path(logdir))
    except FileNotFoundError:
        return False
    fsync_dir(os.fspath(logdir))
    logger.info("a new training session starts in %s: removed its finished mark", os.fspath(logdir))
    return True


def read_finished(logdir: str | os.PathLike) -> FinishedMark | None:
    """The finished mark of ``logdir``, or None while the run is not finished."""
    path = finished_path(logdir)
    try:
        with open_regular_file(path, "r", encoding="utf-8") as f:  # a FIFO: refused, never waited on
            text = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        logger.warning("%s cannot be read (%s); treating the run as finished", path, e)
        return FinishedMark()
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return FinishedMark(step=_opt(data.get("step"), int), checkpoint=_opt(data.get("checkpoint"), str),
                            wall_time=_opt(data.get("wall_time"), float), host=_opt(data.get("host"), str),
                            pid=_opt(data.get("pid"), int))
    except (ValueError, TypeError) as e:
        logger.warning("%s is damaged (%s); treating the run as finished", path, e)
        return FinishedMark()


def _opt(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, bool):
        return None
    return kind(value)
