"""Workers waiting for the chief (SPEC §12; AdaNet's ``worker_wait_timeout_secs``).

A worker that must not run ahead of the chief — a staggered start (TF's
``GlobalStepWaiterHook``, ``Experiment(delay_workers_by_global_step=True)``), or AdaNet's next
iteration that needs the chief's committed step — reads the chief's *committed* progress: the
step of the checkpoint the logdir's index points at (§5.3), which only changes after a commit.

Example::

    from supervisor.distributed import wait_for_global_step
    step = wait_for_global_step("runs/exp", 1000, timeout_secs=3600)   # TimeoutError after 1 h
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from supervisor._validate import check_int, check_number
from supervisor.checkpoint.format import step_of
from supervisor.checkpoint.index import read_index
from supervisor.clock import Clock, resolve_clock

__all__ = ["committed_step", "wait_for_global_step"]

logger = logging.getLogger(__name__)


def committed_step(logdir: str | os.PathLike, basename: str = "model.ckpt") -> int | None:
    """The step of the checkpoint ``logdir``'s index points at; None when there is none yet.
    Reads the index only (the chief rewrites it atomically after each commit)."""
    try:
        index = read_index(os.fspath(logdir))
    except (OSError, ValueError):
        return None
    if index is None or not index.model_checkpoint_path:
        return None
    return step_of(os.path.basename(os.path.normpath(index.model_checkpoint_path)), basename)


def wait_for_global_step(logdir: str | os.PathLike, step: int, *, timeout_secs: float | None = 7200,
                         poll_secs: float = 1.0, basename: str = "model.ckpt",
                         should_stop: Callable[[], bool] | None = None, clock: Clock | None = None) -> int | None:
    """Blocks until the chief has committed a checkpoint of at least ``step`` in ``logdir``.

    Args:
        logdir: the chief's checkpoint directory.
        step: the step to wait for.
        timeout_secs: give up after this long (None: wait as long as it takes).
        poll_secs: seconds between two looks at the index.
        basename: the checkpoints' basename.
        should_stop: ``should_stop() -> bool``; when it returns True the wait ends early.
        clock: injectable clock.

    Returns:
        The committed step reached (``>= step``), or the latest one seen when ``should_stop`` ended the wait.

    Raises:
        TimeoutError: ``timeout_secs`` passed first; names the logdir, the step and what was seen.
    """
    step = check_int("step", step)
    timeout_secs = check_number("timeout_secs", timeout_secs, minimum=0, allow_none=True)
    poll_secs = check_number("poll_secs", poll_secs, strictly_positive=True)
    clock = resolve_clock(clock)
    start = clock.monotonic()
    while True:
        seen = committed_step(logdir, basename)
        if seen is not None and seen >= step:
            return seen
        if should_stop is not None and should_stop():
            return seen
        waited = clock.monotonic() - start
        if timeout_secs is not None and waited >= timeout_secs:
            raise TimeoutError(
                f"waited {waited:.0f} s (timeout_secs={timeout_secs:g}) for the chief to commit step {step} "
                f"in {os.fspath(logdir)}; the newest committed step is "
                f"{'none yet' if seen is None else seen}. Check that the chief is running, or raise the timeout")
        logger.debug("waiting for step %d in %s (committed: %s)", step, os.fspath(logdir), seen)
        clock.sleep(poll_secs if timeout_secs is None else min(poll_secs, timeout_secs - waited))
