"""Small TF hooks: `GlobalStepWaiterHook`, `FinalOpsHook`, `FeedFnHook`."""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Callable

from supervisor.checkpoint.storage import is_url, storage_for
from supervisor.clock import Clock, resolve_clock
from supervisor.creators import committed_step
from supervisor.hook import Hook, RunArgs, RunContext, check_fetch_structure, resolve_fetches
from supervisor.toolkit import check_callable, check_int, check_number

__all__ = ["GlobalStepWaiterHook", "FinalOpsHook", "FeedFnHook"]

logger = logging.getLogger(__name__)

_LOG_EVERY_STEPS = 1000


class GlobalStepWaiterHook(Hook):
    """Delays this process's first step until a global step is reached (TF's staggered start).

    TF's workers read the shared global step from a parameter server. Here the step to watch
    is ``step_fn()`` if given, else the newest checkpoint's step in the session's log
    directory (what the chief has committed) or the session's own step, whichever is higher.
    The wait polls every ``poll_secs`` and ends early when the session is asked to stop
    (e.g. by a signal).

    Args:
        wait_until_step: the step to wait for; ``<= 0`` does not wait.
        step_fn: ``step_fn() -> int``, the step to watch.
        poll_secs: seconds between two looks at the step.
        timeout_secs: give up after this long with a `TimeoutError` naming the step waited for
            and the one seen (AdaNet's ``worker_wait_timeout_secs``); None waits indefinitely.
            `supervisor.creators.wait_for_global_step` is the same wait outside a session.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
        storage_options: the object-store client's options when the session's log directory is
            a URL (``s3://bucket/prefix``); None: the standard configuration (``AWS_*``, ``~/.aws``).
    """

    def __init__(self, wait_until_step: int, *, step_fn: Callable[[], int] | None = None,
                 poll_secs: float = 0.5, timeout_secs: float | None = None, clock: Clock | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self._wait_until_step = check_int("wait_until_step", wait_until_step)
        self._step_fn = check_callable("step_fn", step_fn, signature="step_fn() -> int")
        self._poll_secs = check_number("poll_secs", poll_secs, strictly_positive=True)
        self._timeout_secs = check_number("timeout_secs", timeout_secs, minimum=0, allow_none=True)
        self._clock = resolve_clock(clock)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a dict of the object-store client's options or None, "
                            f"got {storage_options!r}")
        self._storage_options = dict(storage_options) if storage_options else None
        self._storage: Any = None  # the URL logdir's, made at the first look
        self._warned = False  # an unreadable index is reported once
        self._started = False

    def begin(self) -> None:
        self._started = self._wait_until_step <= 0

    def before_run(self, run_context: RunContext) -> None:
        if self._started:
            return None
        session = run_context.session
        if self._step_fn is None and session.logdir is None and session.global_step < self._wait_until_step:
            raise RuntimeError(f"GlobalStepWaiterHook would wait forever for step {self._wait_until_step}: the "
                               f"session is at step {session.global_step} and has no logdir whose checkpoints "
                               "could show progress; pass step_fn=... to say where the step comes from")
        logger.info("waiting for global step %d before starting training", self._wait_until_step)
        last_logged = 0
        start = self._clock.monotonic()
        while True:
            step = self._current_step(session)
            if step >= self._wait_until_step:
                self._started = True
                return None
            if step - last_logged > _LOG_EVERY_STEPS:
                logger.info("waiting for global step %d before starting training; now at step %d",
                            self._wait_until_step, step)
                last_logged = step
            if session.stop_requested:
                self._started = True  # stopped while waiting (e.g. SIGTERM): this last step ends it
                return None
            waited = self._clock.monotonic() - start
            if self._timeout_secs is not None and waited >= self._timeout_secs:
                raise TimeoutError(f"GlobalStepWaiterHook waited {waited:.0f} s (timeout_secs="
                                   f"{self._timeout_secs:g}) for global step {self._wait_until_step}; "
                                   f"the step is {step}. Check that the chief is running, or raise timeout_secs")
            self._clock.sleep(self._poll_secs if self._timeout_secs is None
                              else min(self._poll_secs, self._timeout_secs - waited))

    def _current_step(self, session: Any) -> int:
        if self._step_fn is not None:
            return int(self._step_fn())
        return max(session.global_step, self._latest_checkpoint_step(session.logdir))

    def _latest_checkpoint_step(self, logdir: str | None) -> int:
        """The step of the index's ``model_checkpoint_path`` (SPEC §5.3), or -1; a URL logdir's
        index is read through its storage (this hook's ``storage_options``)."""
        if logdir is None:
            return -1
        if not is_url(logdir):
            return _local_checkpoint_step(logdir)
        if self._storage is None:
            self._storage = storage_for(logdir, self._storage_options)
        try:
            step = committed_step(logdir, storage=self._storage, raise_errors=True)
        except (OSError, ValueError) as e:  # e.g. the client's credentials: say so, keep waiting
            if not self._warned:
                logger.warning("GlobalStepWaiterHook cannot read the checkpoint index of %s (%s); pass "
                               "storage_options= for its client. Still waiting", logdir, e)
                self._warned = True
            return -1
        return -1 if step is None else step


def _local_checkpoint_step(logdir: str) -> int:
    """The step of the local index file's ``model_checkpoint_path``, or -1."""
    try:
        with open(os.path.join(logdir, "checkpoint"), encoding="utf-8") as index:
            text = index.read()
    except OSError:
        return -1
    match = re.search(r'^model_checkpoint_path:\s*"[^"]*?-(\d+)"', text, re.MULTILINE)
    return int(match.group(1)) if match else -1


class FinalOpsHook(Hook):
    """Evaluates ``final_fns`` at a clean end and keeps the result in `final_ops_values`.

    Example::

        final = FinalOpsHook({"accuracy": accuracy.compute})
        ...  # run the session to its end
        final.final_ops_values["accuracy"]

    Args:
        final_fns: a zero-argument callable, an output key of the last step, or a
            list/tuple/dict of those (the result mirrors the structure).
    """

    def __init__(self, final_fns: Any) -> None:
        check_fetch_structure("final_fns", final_fns)
        self._final_fns = final_fns
        self._final_ops_values: Any = None

    @property
    def final_ops_values(self) -> Any:
        """What ``final_fns`` returned at the end (None before)."""
        return self._final_ops_values

    def end(self, session: Any) -> None:
        try:
            self._final_ops_values = resolve_fetches(self._final_fns, session.last_output, self)
        except StopIteration:
            # TF's advice, still true: a final value must not read more input.
            logger.warning("FinalOpsHook: a final function raised StopIteration; final functions must only "
                           "read accumulated state (e.g. metric.compute), never draw another batch")
            raise


class FeedFnHook(Hook):
    """Calls ``feed_fn()`` before every step and passes the returned dict to the step function
    as keyword arguments.

    Args:
        feed_fn: ``feed_fn() -> {name: value}``.
    """

    def __init__(self, feed_fn: Callable[[], Mapping[str, Any]]) -> None:
        self._feed_fn = check_callable("feed_fn", feed_fn, allow_none=False, signature="feed_fn() -> {name: value}")

    def before_run(self, run_context: RunContext) -> RunArgs:
        return RunArgs(feeds=self._feed_fn())


