"""The continuous-evaluation loop (SPEC §10.2 evaluator role, §10.4): one loop for
`SidecarEvaluator.start()` and the ``evaluator`` task of ``train_and_evaluate``.

``EvaluationLoop(checkpoint_dir, evaluate_fn, ...)`` watches a trainer's log directory from
another process and calls ``evaluate_fn(checkpoint)`` on each new checkpoint, where
``checkpoint`` is a `supervisor.checkpoint.CheckpointRead` (``path``, ``step``,
``manifest``, ``payload`` — the saved mapping, already verified):

- **which**: the one the index names (``latest_checkpoint``). A checkpoint superseded while the
  previous evaluation ran is never evaluated (TF and Keras semantics: always the newest);
  steps already evaluated by this loop, or for which ``skip_step(step)`` is true (a restarted
  evaluator: steps already in its event files), are waited past.
- **read once**: the files are opened, checksummed while loaded, from open descriptors
  (`read_checkpoint`). One that vanished before it could be opened (retention) is skipped with
  an INFO line; one that fails verification with a WARNING (never evaluated, never retried).
- **when** (TF's ``checkpoints_iterator`` and ``_TrainingExecutor.run_evaluator``): first wait
  ``start_delay_secs``; start evaluations at least ``max(min_interval_secs, throttle_secs)``
  apart; look for a new checkpoint every ``poll_secs``. When ``timeout`` seconds pass without a
  new checkpoint, stop unless ``timeout_fn()`` returns False (then keep waiting).
- **until**: ``max_evaluations`` evaluations by this loop; a checkpoint at ``global_step >=
  max_steps`` evaluated; the trainer marked the run finished (`supervisor.checkpoint.layout.finished`)
  and nothing newer is left to evaluate — so the final checkpoint is always evaluated first;
  `stop()` (from another thread or a signal handler); or the timeout.

Iterating yields one `EvaluationResult` per evaluation, as it happens; `run()` collects them.
``loop.stats`` counts what happened (evaluated / vanished / corrupt / skipped) and
``loop.stop_reason`` says why it ended.

Example::

    def evaluate(ckpt):
        model.load_state_dict(ckpt.payload["model"])
        return {"loss": compute_loss(model)}

    for result in EvaluationLoop("/tmp/run", evaluate, timeout=600):
        print(result.step, result.metrics)
"""
from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from supervisor._paths import check_watched_directory, local_path
from supervisor._validate import check_callable, check_choice, check_int, check_number
from supervisor.checkpoint import VERIFY_MODES, CheckpointRead, check_trusted_globals, latest_checkpoint
from supervisor.checkpoint import read_checkpoint, read_finished
from supervisor.checkpoint.storage import LocalStorage, Location, is_url, resolve_location
from supervisor.clock import Clock, resolve_clock
from supervisor.errors import CheckpointCorruptError, CheckpointVanishedError

__all__ = ["EvaluationLoop", "EvaluationResult", "EvaluationStats", "StopReason", "evaluation_loop",
           "watched_location"]

logger = logging.getLogger(__name__)

_STEP_SUFFIX = re.compile(r"-(\d+)$")
_LOCAL = LocalStorage()


class StopReason:
    """Why an `EvaluationLoop` ended (``loop.stop_reason``)."""

    MAX_EVALUATIONS = "max_evaluations"
    MAX_STEPS = "max_steps"
    FINISHED = "finished"  # the trainer marked the run finished and nothing new is left
    TIMEOUT = "timeout"
    STOPPED = "stop requested"  # stop() was called (a signal, another thread)


@dataclass(frozen=True)
class EvaluationResult:
    """One evaluation: the checkpoint's step and path, what ``evaluate_fn`` returned, and when
    the evaluation started (``started_wall_time``, seconds since the epoch: the start of the
    checkpoint's read)."""

    step: int
    path: str
    metrics: Any
    started_wall_time: float = 0.0


@dataclass
class EvaluationStats:
    """What the loop did with the checkpoints it saw.

    Attributes:
        evaluated: checkpoints evaluated.
        vanished: checkpoints deleted (retention) before they could be opened; skipped (INFO).
        corrupt: checkpoints that failed verification; skipped for good (WARNING).
        skipped: checkpoints skipped because ``skip_step`` said so (already evaluated earlier).
        deleted_while_reading: checkpoints retention deleted while they were being read, read
            whole anyway from the open files (and evaluated).
        bytes_read: bytes read from the checkpoints evaluated.
        steps: the steps evaluated, in order.
    """

    evaluated: int = 0
    vanished: int = 0
    corrupt: int = 0
    skipped: int = 0
    deleted_while_reading: int = 0
    bytes_read: int = 0
    steps: list[int] = field(default_factory=list)


class EvaluationLoop:
    """Evaluates each new verified checkpoint of ``checkpoint_dir`` (see the module docstring).

    Args:
        checkpoint_dir: the trainer's log directory (only read; no lock is taken).
        evaluate_fn: ``evaluate_fn(checkpoint: CheckpointRead) -> metrics``; its return value
            becomes `EvaluationResult.metrics`. An exception from it ends the loop (it is raised
            to the caller): an evaluation bug must not be retried silently.
        min_interval_secs: at least this long between the starts of two evaluations (TF's
            ``checkpoints_iterator``).
        timeout: seconds to wait for a new checkpoint before giving up (None: forever).
        timeout_fn: called at a timeout; True ends the loop, False keeps waiting. None: a
            timeout ends the loop.
        start_delay_secs: wait this long before the first look (``EvalSpec.start_delay_secs``).
        throttle_secs: as ``min_interval_secs`` (``EvalSpec.throttle_secs``); the larger wins.
        max_evaluations: stop after this many evaluations by this loop (None: no limit).
        max_steps: stop after evaluating a checkpoint at ``global_step >= max_steps``.
        skip_step: ``skip_step(step) -> bool``; True: do not evaluate that step (already done).
        poll_secs: how often to look for a new checkpoint.
        verify: ``"full"`` (sizes and checksums, default) or ``"size"``.
        trusted_globals: extra globals ``torch.load(weights_only=True)`` may load.
        map_location: where loaded tensors go (default ``"cpu"``).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
        storage_options: for an ``s3://bucket/prefix`` ``checkpoint_dir``, the object-store
            client's options (None: the standard configuration, ``AWS_*``/``AWS_ENDPOINT_URL``
            in the environment, ``~/.aws``, ``FSSPEC_S3_*``); refused for a local path.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike, evaluate_fn: Callable[[CheckpointRead], Any], *,
                 min_interval_secs: float = 0, timeout: float | None = None,
                 timeout_fn: Callable[[], bool] | None = None, start_delay_secs: float = 0,
                 throttle_secs: float = 0, max_evaluations: int | None = None,
                 max_steps: int | None = None, skip_step: Callable[[int], bool] | None = None,
                 poll_secs: float = 1.0, verify: str = "full", trusted_globals: Iterable[Any] = (),
                 map_location: Any = "cpu", clock: Clock | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        location = watched_location("checkpoint_dir", checkpoint_dir, storage_options)
        self.checkpoint_dir, self._storage = location.path, location.storage if location.is_object_store else None
        self._on = {"storage": location.storage}  # made once: every look at the index, mark and checkpoint
        self.evaluate_fn = check_callable("evaluate_fn", evaluate_fn, allow_none=False,
                                          signature="evaluate_fn(checkpoint) -> metrics")
        self.min_interval_secs = check_number("min_interval_secs", min_interval_secs, minimum=0)
        self.timeout = check_number("timeout", timeout, minimum=0, allow_none=True)
        self.timeout_fn = check_callable("timeout_fn", timeout_fn, signature="timeout_fn() -> bool")
        self.start_delay_secs = check_number("start_delay_secs", start_delay_secs, minimum=0)
        self.throttle_secs = check_number("throttle_secs", throttle_secs, minimum=0)
        self.max_evaluations = check_int("max_evaluations", max_evaluations, minimum=1, allow_none=True)
        self.max_steps = check_int("max_steps", max_steps, minimum=0, allow_none=True)
        self.skip_step = check_callable("skip_step", skip_step, signature="skip_step(step) -> bool")
        self.poll_secs = check_number("poll_secs", poll_secs, strictly_positive=True)
        self.verify = check_choice("verify", verify, VERIFY_MODES)
        self.trusted_globals = check_trusted_globals(trusted_globals)
        self.map_location = map_location
        self._clock = resolve_clock(clock)
        self._stop_event = threading.Event()
        self.stats = EvaluationStats()
        self.stop_reason: str | None = None
        # Paths evaluated, skipped or found corrupt, and steps evaluated: never again. The index
        # only ever names the newest checkpoint, so the recent ones are all that can come back.
        self._seen = _Recent()
        self._evaluated_steps = _Recent()

    def stop(self) -> None:
        """Ends the loop at its next wait (thread-safe); an evaluation under way finishes first."""
        self._stop_event.set()

    def run(self) -> list[EvaluationResult]:
        """Runs the loop to its end; returns every result."""
        return list(self)

    def __iter__(self) -> Iterator[EvaluationResult]:
        if self.start_delay_secs and self._wait(self.start_delay_secs):
            self._end(StopReason.STOPPED)
            return
        while True:
            path = self._next_checkpoint()
            if path is None:
                return
            started = self._clock.monotonic()
            result = self._evaluate(path)
            if result is None:
                continue
            yield result
            reason = self._limit_reached(result.step)
            if reason is not None:
                self._end(reason)
                return
            interval = max(self.min_interval_secs, self.throttle_secs)
            remaining = started + interval - self._clock.monotonic()
            if remaining > 0 and self._wait(remaining):
                self._end(StopReason.STOPPED)
                return

    # ---------------------------------------------------------------- one evaluation
    def _evaluate(self, path: str) -> EvaluationResult | None:
        """Reads, verifies and evaluates ``path``; None when it vanished or is corrupt."""
        self._seen.add(path)
        wall_time = self._clock.time()
        try:
            checkpoint = read_checkpoint(path, verify=self.verify, trusted_globals=self.trusted_globals,
                                         map_location=self.map_location, **self._on)
        except CheckpointVanishedError:
            self.stats.vanished += 1
            logger.info("skipping %s: it was deleted before it could be read (a newer checkpoint "
                        "superseded it)", path)
            return None
        except CheckpointCorruptError as e:
            self.stats.corrupt += 1
            logger.warning("skipping checkpoint %s: %s", path, e)
            return None
        self.stats.bytes_read += checkpoint.bytes_read
        self.stats.deleted_while_reading += checkpoint.deleted_while_reading
        step = checkpoint.step
        if step in self._evaluated_steps:  # the index named another path for a step already done
            return None
        logger.info("evaluating %s (step %d)", path, step)
        metrics = self.evaluate_fn(checkpoint)
        del checkpoint  # the payload can be large: do not hold it through the next wait
        self._evaluated_steps.add(step)
        self.stats.evaluated += 1
        self.stats.steps.append(step)
        logger.debug("evaluated step %d: %s", step, _metrics_text(metrics))
        return EvaluationResult(step=step, path=path, metrics=metrics, started_wall_time=wall_time)

    def _limit_reached(self, step: int) -> str | None:
        if self.max_evaluations is not None and self.stats.evaluated >= self.max_evaluations:
            return StopReason.MAX_EVALUATIONS
        if self.max_steps is not None and step >= self.max_steps:
            return StopReason.MAX_STEPS
        return None

    # ---------------------------------------------------------------- waiting
    def _next_checkpoint(self) -> str | None:
        """Waits for a new checkpoint to evaluate; None when the loop ends (reason recorded)."""
        while True:
            deadline = None if self.timeout is None else self._clock.monotonic() + self.timeout
            while True:
                path = self._new_checkpoint()
                if path is not None:
                    return path
                if read_finished(self.checkpoint_dir, **self._on) is not None:
                    # The mark is written after the final checkpoint is published: a look at the
                    # index now cannot miss it, even if it was committed since the look above.
                    path = self._new_checkpoint()
                    if path is not None:
                        return path
                    self._end(StopReason.FINISHED)
                    return None
                now = self._clock.monotonic()
                if deadline is not None and now >= deadline:
                    break
                wait = self.poll_secs if deadline is None else min(self.poll_secs, deadline - now)
                if self._wait(wait):
                    self._end(StopReason.STOPPED)
                    return None
            if self.timeout_fn is None or self.timeout_fn():
                self._end(StopReason.TIMEOUT)
                return None

    def _new_checkpoint(self) -> str | None:
        path = latest_checkpoint(self.checkpoint_dir, **self._on)
        if path is None or path in self._seen:
            return None
        step = _step_hint(path)
        if step is not None and step in self._evaluated_steps:
            self._seen.add(path)
            return None
        if step is not None and self.skip_step is not None and self.skip_step(step):
            self._seen.add(path)
            self.stats.skipped += 1
            logger.info("skipping %s: step %d was already evaluated", path, step)
            return None
        return path

    def _wait(self, secs: float) -> bool:
        """Waits ``secs`` (on the clock); True when `stop` was called."""
        return self._clock.wait(self._stop_event, secs)

    def _end(self, reason: str) -> None:
        self.stop_reason = reason
        logger.info("evaluation loop over %s ends (%s) after %d evaluation(s)", self.checkpoint_dir,
                    reason, self.stats.evaluated)


def watched_location(name: str, value: Any, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The directory a reader follows, resolved: a local path checked
    (`supervisor._paths.check_watched_directory`: it need not exist yet) and made absolute, with
    the local storage (no client built); an object-store URL (``s3://bucket/prefix``, never made
    absolute; no trailing ``/``) with its storage, built here; a `Location` given (resolved
    already) as it is (a local one checked and made absolute).

    Raises:
        ValueError: a local path that is (or is under) a file, ``storage_options`` for a local
            path, an unknown URL scheme (each message names ``name`` and the value).
        ImportError: the URL's client is not installed (the message names the pip extra).
    """
    if isinstance(value, Location) and storage_options is None:
        if value.is_object_store:
            return value
        return Location(os.path.abspath(check_watched_directory(name, value.path)), value.storage)
    if isinstance(value, (str, os.PathLike)) and is_url(value):
        try:
            return resolve_location(os.fspath(value).rstrip("/"), storage_options)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None
    if storage_options:
        raise ValueError(f"{name} {value!r} is a local path, but storage_options={dict(storage_options)!r} were "
                         "given; they apply to object-store URLs only (s3://bucket/prefix)")
    return Location(os.path.abspath(check_watched_directory(name, local_path(value))), _LOCAL)


def evaluation_loop(checkpoint_dir: str | os.PathLike, evaluate_fn: Callable[[CheckpointRead], Any],
                    **options: Any) -> list[EvaluationResult]:
    """Runs an `EvaluationLoop` to its end and returns its results (the same options)."""
    return EvaluationLoop(checkpoint_dir, evaluate_fn, **options).run()


class _Recent:
    """A set that keeps only its ``capacity`` most recent members (bounded memory for an
    evaluator that runs for months)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._members: dict[Any, None] = {}
        self._capacity = capacity

    def add(self, item: Any) -> None:
        self._members.pop(item, None)
        self._members[item] = None
        if len(self._members) > self._capacity:
            del self._members[next(iter(self._members))]

    def __contains__(self, item: Any) -> bool:
        return item in self._members


def _step_hint(path: str) -> int | None:
    """The step in a checkpoint directory's name (``model.ckpt-1200`` → 1200), else None."""
    match = _STEP_SUFFIX.search(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def _metrics_text(metrics: Any) -> str:
    if isinstance(metrics, Mapping):
        return ", ".join(f"{k} = {v}" for k, v in metrics.items())
    return repr(metrics)
