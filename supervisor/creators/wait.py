"""Workers waiting for the chief (SPEC §12; AdaNet's ``worker_wait_timeout_secs``).

It stands here, beside the worker's session creator (which also waits for the chief's
checkpoint), above `supervisor.checkpoint`, whose index it reads (issue 32: in
``supervisor/distributed`` it was an import back up). ``supervisor.distributed.wait_for_global_step``
and ``committed_step``, the names' first address, still work: `supervisor`'s façade hands them on.

A worker that must not run ahead of the chief — a staggered start (TF's
``GlobalStepWaiterHook``, ``Experiment(delay_workers_by_global_step=True)``), or AdaNet's next
iteration that needs the chief's committed step — reads the chief's *committed* progress: the
step of the checkpoint the logdir's index points at (§5.3), which only changes after a commit.
The logdir may be a local path or an object-store URL (``s3://bucket/prefix``, SPEC §16: the
index is read with ``storage_options``, or the client the environment configures).

Example::

    from supervisor.creators import wait_for_global_step
    step = wait_for_global_step("runs/exp", 1000, timeout_secs=3600)   # TimeoutError after 1 h
    step = wait_for_global_step("s3://bucket/exp", 1000, storage_options={"endpoint_url": ...})
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from supervisor._validate import check_int, check_number
from supervisor.checkpoint.layout.format import step_of
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.storage import Location, Storage, check_location, split_scheme
from supervisor.clock import Clock, resolve_clock

__all__ = ["committed_step", "wait_for_global_step"]

logger = logging.getLogger(__name__)


def committed_step(logdir: str | os.PathLike | Location, basename: str = "model.ckpt", *,
                   storage_options: Mapping[str, Any] | None = None, storage: Storage | None = None,
                   raise_errors: bool = False) -> int | None:
    """The step of the checkpoint ``logdir``'s index points at; None when there is none yet (or
    the index cannot be read: ``raise_errors`` raises that `OSError`/`ValueError` instead).
    Reads the index only (the chief replaces it after each commit). ``storage_options``: the
    client's options for a URL (``storage``: its storage, made once; or ``logdir`` a resolved
    `Location`)."""
    if storage is not None:  # made once by the caller: no client built here
        scheme, spelled = split_scheme(logdir)
        location = Location(spelled if scheme == "file" else spelled.rstrip("/"), storage)
    else:
        location = check_location("logdir", logdir, storage_options)  # type: ignore[arg-type, assignment]
    step, problem = _read_committed(location, basename)  # type: ignore[arg-type]
    if problem is not None and raise_errors:
        raise problem
    return step


def _read_committed(location: Location, basename: str) -> tuple[int | None, OSError | ValueError | None]:
    """``(committed step or None, the error that kept the index from being read or None)``."""
    try:
        index = read_index(location.path, location.storage)
    except (OSError, ValueError) as e:
        return None, e
    if index is None or not index.model_checkpoint_path:
        return None, None
    return step_of(os.path.basename(os.path.normpath(index.model_checkpoint_path)), basename), None


def wait_for_global_step(logdir: str | os.PathLike | Location, step: int, *, timeout_secs: float | None = 7200,
                         poll_secs: float = 1.0, basename: str = "model.ckpt",
                         should_stop: Callable[[], bool] | None = None, clock: Clock | None = None,
                         storage_options: Mapping[str, Any] | None = None) -> int | None:
    """Blocks until the chief has committed a checkpoint of at least ``step`` in ``logdir``.

    Args:
        logdir: the chief's checkpoint directory: a local path or a URL (``s3://bucket/prefix``).
        step: the step to wait for.
        timeout_secs: give up after this long (None: wait as long as it takes).
        poll_secs: seconds between two looks at the index.
        basename: the checkpoints' basename.
        should_stop: ``should_stop() -> bool``; when it returns True the wait ends early.
        clock: injectable clock.
        storage_options: a URL's client options (None: ``AWS_*``, ``~/.aws``); refused locally.

    Returns:
        The committed step reached (``>= step``), or the latest one seen when ``should_stop`` ended the wait.

    Raises:
        TimeoutError: ``timeout_secs`` passed first; names the logdir, the step and what was seen.
        ValueError: ``storage_options`` with a local path, or an unknown URL scheme.
    """
    step = check_int("step", step)
    timeout_secs = check_number("timeout_secs", timeout_secs, minimum=0, allow_none=True)
    poll_secs = check_number("poll_secs", poll_secs, strictly_positive=True)
    clock = resolve_clock(clock)
    location: Location = check_location("logdir", logdir, storage_options)  # type: ignore[arg-type, assignment]
    directory, start = location.path, clock.monotonic()
    while True:
        seen, problem = _read_committed(location, basename)
        if seen is not None and seen >= step:
            return seen
        if should_stop is not None and should_stop():
            return seen
        waited = clock.monotonic() - start
        if timeout_secs is not None and waited >= timeout_secs:
            raise _timed_out(waited, timeout_secs, step, directory, seen, problem)
        logger.debug("waiting for step %d in %s (committed: %s)", step, directory, seen)
        clock.sleep(poll_secs if timeout_secs is None else min(poll_secs, timeout_secs - waited))


def _timed_out(waited: float, timeout_secs: float, step: int, directory: str, seen: int | None,
               problem: Exception | None) -> TimeoutError:
    why = f" (the index cannot be read: {problem})" if problem else ""
    return TimeoutError(
        f"waited {waited:.0f} s (timeout_secs={timeout_secs:g}) for the chief to commit step {step} "
        f"in {directory}; the newest committed step is {'none yet' if seen is None else seen}{why}. "
        "Check that the chief is running, or raise the timeout")
