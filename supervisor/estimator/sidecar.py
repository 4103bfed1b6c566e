"""`SidecarEvaluator`: Keras' dedicated evaluator task, for PyTorch (SPEC §10.4).

Runs in its own process next to a trainer and evaluates each new checkpoint the trainer
commits, on the `EvaluationLoop` that ``train_and_evaluate``'s evaluator uses too:

- each checkpoint is read once from open descriptors, verified while loaded
  (`supervisor.checkpoint.load.loader`); one deleted by retention before it could be opened is
  skipped with an INFO line, a damaged one with a WARNING — the evaluator never crashes on
  either, and never evaluates a partial or mixed checkpoint;
- the checkpoint's ``"model"`` entry is loaded into ``model`` (wrapper prefixes reconciled),
  which then runs in eval mode under ``torch.no_grad()``, on at most ``steps`` batches of
  ``data`` (None: all of it);
- metrics are the means of the scalars ``eval_step(model, batch)`` returns (``model(batch)``
  without ``eval_step``: a scalar loss or a dict of scalars), plus ``metrics={name: obj}``
  objects (``reset()`` before, ``update(outputs, batch)`` per batch, ``compute()`` at the end);
- they are written with bare tags (``loss``, ``accuracy``) at the checkpoint's step to
  ``log_dir`` (default ``checkpoint_dir/eval`` or ``eval_<name>``), fsynced per evaluation;
- hooks get the usual lifecycle once per evaluation (``begin``, ``after_create_session``,
  ``before_run``/``after_run`` per batch — a hook's ``request_stop`` ends that evaluation —
  ``end``), on a session whose ``global_step`` starts at the checkpoint's step and whose
  ``state["model"]`` is the evaluated model;
- it stops after ``max_evaluations`` evaluations by this process (Keras compared the
  checkpoint's number instead), when the trainer marked the run finished (after evaluating the
  final checkpoint), at ``timeout`` (as `checkpoints_iterator`), or at `stop`;
- a restarted evaluator reads its event files (``EventAccumulator``) and does not evaluate again
  a step whose metrics are there;
- it takes no lock and writes nothing into the trainer's files (only into ``log_dir``).

Example (the evaluator process; the trainer is any front door writing to ``/tmp/run``)::

    SidecarEvaluator(Net(), eval_loader, "/tmp/run", steps=20,
                     eval_step=lambda m, b: {"loss": F.cross_entropy(m(b[0]), b[1])}).start()
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Callable

import torch

from supervisor import _validate as v
from supervisor._paths import check_logdir
from supervisor.checkpoint import META_KEY, RNG_KEY, STEP_KEY, CheckpointRead, Restored
from supervisor.clock import Clock
from supervisor.creators.base import SessionCreator
from supervisor.errors import CheckpointError
from supervisor.checkpoint.storage import Location, is_url, relocate
from supervisor.estimator.evaluation import EvaluationLoop, EvaluationResult, EvaluationStats, watched_location
from supervisor.estimator.metrics import (
    EvalEventsFile,
    MeanAggregator,
    check_metric_objects,
    flatten_metric,
    read_eval_events,
)
from supervisor.engine.session import MonitoredSession
from supervisor.state import TrainingState, strip_wrapper_prefixes, unwrap_module

__all__ = ["SidecarEvaluator", "eval_dir_for", "evaluate_batches", "evaluated_steps", "model_entry"]

logger = logging.getLogger(__name__)


def eval_dir_for(checkpoint_dir: str | os.PathLike, name: str | None = None) -> str:
    """``checkpoint_dir/eval`` or ``checkpoint_dir/eval_<name>`` (TF's layout; ``/`` inside an
    ``s3://`` URL)."""
    leaf = "eval" if not name else f"eval_{name}"
    if is_url(checkpoint_dir):
        return f"{os.fspath(checkpoint_dir).rstrip('/')}/{leaf}"
    return os.path.join(os.fspath(checkpoint_dir), leaf)


def evaluated_steps(log_dir: str | os.PathLike | Location) -> set[int]:
    """The steps that have scalar events in ``log_dir``'s event files (`read_eval_events`: regular
    files only, never blocking on a FIFO; a URL's objects, through a resolved `Location`'s
    storage); empty when there are none."""
    return set(read_eval_events(log_dir))


class SidecarEvaluator:
    """Evaluates a trainer's checkpoints from a separate process (see the module docstring).

    Args:
        model: the ``torch.nn.Module`` to load each checkpoint's ``"model"`` entry into.
        data: the evaluation batches: a re-iterable (list, ``DataLoader``) iterated afresh for
            every evaluation, or a function returning one (called for every evaluation).
        checkpoint_dir: the trainer's log directory.
        steps: batches per evaluation (None: until ``data`` is exhausted).
        max_evaluations: stop after this many evaluations by this process (None: no limit).
        hooks: `supervisor.Hook` instances, run through each evaluation.
        metrics: ``{name: obj}`` with ``update(outputs, batch)``, ``compute()``, ``reset()``; a
            ``compute()`` returning a dict gives ``name/key`` metrics.
        eval_step: ``eval_step(model, batch) -> {name: scalar}`` (None: ``model(batch)``).
        log_dir: where the metrics' events go (default: `eval_dir_for(checkpoint_dir, name)`).
        name: the evaluation's name (``eval_<name>``), to run several evaluators on one run.
        timeout, timeout_fn, min_interval_secs, poll_secs: as `EvaluationLoop` (defaults:
            wait forever, look every second).
        verify: ``"full"`` or ``"size"``; trusted_globals: as `CheckpointManager`.
        clock: injectable clock.
        storage_options: for an ``s3://bucket/prefix`` ``checkpoint_dir`` (and ``log_dir``), the
            object-store client's options (None: the standard ``AWS_*`` configuration). On a URL
            the evaluator follows the index there, reads each checkpoint once (verified while
            read), writes each evaluation's events as a new object under ``log_dir`` (default
            ``<url>/eval``) and ends at the trainer's finished mark, as on a local path.
    """

    def __init__(self, model: torch.nn.Module, data: Any, checkpoint_dir: str | os.PathLike, *,
                 steps: int | None = None, max_evaluations: int | None = None, hooks: Iterable[Any] = (),
                 metrics: Mapping[str, Any] | None = None,
                 eval_step: Callable[[torch.nn.Module, Any], Any] | None = None,
                 log_dir: str | os.PathLike | None = None, name: str | None = None,
                 timeout: float | None = None, timeout_fn: Callable[[], bool] | None = None,
                 min_interval_secs: float = 0, poll_secs: float = 1.0, verify: str = "full",
                 trusted_globals: Iterable[Any] = (), clock: Clock | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(unwrap_module(model), torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.data = _check_data(data)
        location = watched_location("checkpoint_dir", checkpoint_dir, storage_options)  # resolved once
        self.checkpoint_dir = location.path
        self.storage_options = storage_options
        self.steps = v.check_int("steps", steps, minimum=1, allow_none=True)
        self.hooks = v.check_hooks("hooks", hooks)
        self.metrics = check_metric_objects(metrics)
        self.eval_step = v.check_callable("eval_step", eval_step, signature="eval_step(model, batch) -> {name: scalar}")
        if name is not None and (not isinstance(name, str) or not name or os.sep in name):
            raise ValueError(f"name must be a non-empty string without {os.sep!r} (the eval directory is "
                             f"eval_<name>), got {name!r}")
        self.name = name
        self._log = _eval_log_dir(log_dir, location, name)
        self.log_dir = self._log.path
        if self.log_dir == self.checkpoint_dir:
            raise ValueError(f"log_dir must not be the trainer's checkpoint_dir {self.checkpoint_dir} (the "
                             "evaluator never writes into the trainer's files); leave it None for "
                             f"{eval_dir_for(self.checkpoint_dir, name)}")
        self._loop = EvaluationLoop(
            location, self._evaluate, max_evaluations=max_evaluations, timeout=timeout,
            timeout_fn=timeout_fn, min_interval_secs=min_interval_secs, poll_secs=poll_secs,
            skip_step=self._already_evaluated, verify=verify, trusted_globals=trusted_globals, clock=clock)
        self.max_evaluations = self._loop.max_evaluations
        self._events = EvalEventsFile(self._log)
        self._done_before: set[int] = set()

    @property
    def stats(self) -> EvaluationStats:
        """Counts of evaluated / vanished / corrupt / skipped checkpoints (`EvaluationStats`)."""
        return self._loop.stats

    @property
    def stop_reason(self) -> str | None:
        """Why `start` returned (`supervisor.estimator.evaluation.StopReason`), or None."""
        return self._loop.stop_reason

    def stop(self) -> None:
        """Makes `start` return at its next wait (thread-safe; e.g. from a signal handler)."""
        self._loop.stop()

    def start(self) -> list[EvaluationResult]:
        """Runs the evaluation loop until it stops; returns this process's evaluations, each
        with ``metrics`` = ``{name: float, ..., "global_step": step}``."""
        return list(self.evaluations())

    def evaluations(self) -> Iterator[EvaluationResult]:
        """`start`, one evaluation at a time: yields each result as soon as it is written."""
        self._done_before = evaluated_steps(self._log)
        if self._done_before:
            logger.info("%s already holds metrics of %d step(s) (up to %d); they are not evaluated again",
                        self.log_dir, len(self._done_before), max(self._done_before))
        yield from self._loop

    def _already_evaluated(self, step: int) -> bool:
        return step in self._done_before

    # ---------------------------------------------------------------- one evaluation
    def _evaluate(self, checkpoint: CheckpointRead) -> dict[str, Any]:
        self._load(checkpoint)
        checkpoint.payload.clear()  # loaded into the model: free the copy before running batches
        results = evaluate_batches(self.model, self._batches(), steps=self.steps, eval_step=self.eval_step,
                                   metrics=self.metrics, hooks=self.hooks, global_step=checkpoint.step,
                                   path=checkpoint.path)
        self._events.write(results, checkpoint.step)
        logger.info("Saving dict for global step %d: %s", checkpoint.step,
                    ", ".join(f"{k} = {val:.6g}" for k, val in sorted(results.items())))
        return {**results, "global_step": checkpoint.step}

    def _load(self, checkpoint: CheckpointRead) -> None:
        entry = model_entry(checkpoint.payload, f"{checkpoint.path} (step {checkpoint.step})",
                            "the trainer must save the model under the name 'model' (model= of every front door)",
                            CheckpointError)
        module = unwrap_module(self.model)
        try:
            module.load_state_dict(strip_wrapper_prefixes(entry, module.state_dict().keys()))
        except RuntimeError as e:
            raise CheckpointError(f"{checkpoint.path} (step {checkpoint.step}) does not fit the evaluator's "
                                  f"model: {e}") from e

    def _batches(self) -> Iterable[Any]:
        data = self.data() if callable(self.data) and not isinstance(self.data, Iterable) else self.data
        if not isinstance(data, Iterable):
            raise TypeError(f"data() must return an iterable of batches, got {type(data).__name__}")
        return data


def _eval_log_dir(log_dir: Any, checkpoint_dir: Location, name: str | None) -> Location:
    """Where the evaluator's events go: ``log_dir`` (a local path, checked, made absolute; or a
    URL on the checkpoint_dir's object store, through its storage) or `eval_dir_for`."""
    if log_dir is None:
        return Location(eval_dir_for(checkpoint_dir.path, name), checkpoint_dir.storage)
    if isinstance(log_dir, (str, os.PathLike)) and is_url(log_dir):
        # the checkpoint_dir's client when on its store (another scheme: that one's default client)
        return watched_location("log_dir", relocate(checkpoint_dir, log_dir) or log_dir)
    path = os.path.abspath(check_logdir("log_dir", log_dir, hint=" (None: checkpoint_dir/eval)"))
    return relocate(checkpoint_dir, path)  # type: ignore[return-value]


def model_entry(payload: Mapping[str, Any], where: str, fix: str,
                error: type[Exception] = ValueError) -> Mapping[str, Any]:
    """A checkpoint payload's ``model`` entry (the model's state dict); when there is none,
    ``error`` saying so about ``where``, with the entries it has and ``fix``."""
    entry = payload.get("model")
    if not isinstance(entry, Mapping):
        names = [k for k in payload if k not in (META_KEY, RNG_KEY, STEP_KEY)]
        raise error(f"{where} has no 'model' entry (it has {names}); {fix}")
    return entry


def evaluate_batches(model: torch.nn.Module, batches: Iterable[Any], *, steps: int | None = None,
                     eval_step: Callable[[torch.nn.Module, Any], Any] | None = None,
                     metrics: Mapping[str, Any] | None = None, hooks: Iterable[Any] = (),
                     global_step: int = 0, path: str = "") -> dict[str, float]:
    """Runs ``model`` (eval mode, ``torch.no_grad()``) on at most ``steps`` batches through
    ``hooks``; returns the metrics as floats (see `SidecarEvaluator`)."""
    metrics = dict(metrics or {})
    means = MeanAggregator()
    for metric in metrics.values():
        metric.reset()

    def eval_once(batch: Any) -> dict[str, Any]:
        outputs = _outputs(model, batch, eval_step)
        means.add(outputs)
        for metric in metrics.values():
            metric.update(outputs, batch)
        return outputs

    model.eval()
    done = 0
    creator = _EvaluationCreator(TrainingState({"model": model}), global_step, path)
    iterator: Iterator[Any] = iter(batches)
    with _evaluation_session_logs(), torch.no_grad(), MonitoredSession(creator, list(hooks)) as session:
        while not session.should_stop() and (steps is None or done < steps):
            batch = next(iterator, _END)
            if batch is _END:  # the end of the evaluation data: this evaluation is complete
                break
            session.run(eval_once, batch)
            done += 1
    if done == 0:
        raise ValueError("evaluation ran no step: data produced no batch")
    logger.debug("evaluated step %d on %d batch(es)", global_step, done)
    if steps is not None and done < steps:
        logger.warning("data ran out after %d of steps=%d batches", done, steps)
    results = means.result()
    for name, metric in metrics.items():
        results.update(flatten_metric(name, metric.compute()))
    return results


_END = object()


class _ThisThreadOnly(logging.Filter):
    """Drops the INFO records of the calling thread (the evaluation session's own lifecycle
    lines: "restored step=…", "stopping at step …: session closed"), which read like the
    training session's; other threads (a training session running alongside) log as usual."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self._thread or record.levelno > logging.INFO


# The evaluation session's lifecycle logs under these names and their children (a logger's
# filter never sees its children's records, so each logger of the subtree gets the filter).
_QUIET = ("supervisor.engine.session", "supervisor.creators")


def _quiet_loggers() -> list[logging.Logger]:
    """Every logger under `_QUIET` made so far (a module's logger is made at its import)."""
    names = [n for n in list(logging.root.manager.loggerDict) if n.startswith(tuple(p + "." for p in _QUIET))]
    return [logging.getLogger(name) for name in (*_QUIET, *names)]


@contextlib.contextmanager
def _evaluation_session_logs() -> Iterator[None]:
    quiet = _ThisThreadOnly()
    loggers = _quiet_loggers()
    for each in loggers:
        each.addFilter(quiet)
    try:
        yield
    finally:
        for each in loggers:
            each.removeFilter(quiet)


def _outputs(model: torch.nn.Module, batch: Any, eval_step: Callable | None) -> dict[str, Any]:
    if eval_step is not None:
        out = eval_step(model, batch)
    else:
        try:
            out = model(batch)
        except TypeError as e:  # e.g. an (x, y) batch: linear() got a tuple
            raise TypeError(f"no eval_step was given, so evaluation called model(batch) with a "
                            f"{type(batch).__name__} batch, which failed: {e}. Pass eval_step=, e.g. "
                            "def eval_step(model, batch): x, y = batch; return {'loss': loss_fn(model(x), y)}") from e
    if isinstance(out, Mapping):
        return dict(out)
    if isinstance(out, (torch.Tensor, int, float)):
        return {"loss": out}
    who = "eval_step" if eval_step is not None else "model(batch) (no eval_step given)"
    raise TypeError(f"{who} must return a dict of scalars or a scalar loss, got {type(out).__name__}")


class _EvaluationCreator(SessionCreator):
    """Makes an evaluation session start at the checkpoint's step, with the model loaded."""

    def __init__(self, state: TrainingState, step: int, path: str) -> None:
        super().__init__(state, is_chief=False)
        self._restored = Restored(global_step=step, path=path)

    def restore(self, session: Any) -> Restored:
        return self._restored


def _check_data(data: Any) -> Any:
    if isinstance(data, Iterator):
        raise TypeError(f"data is an iterator ({type(data).__name__}), which the second evaluation would find "
                        "exhausted; pass a re-iterable (a list, a DataLoader) or a function returning one")
    if not isinstance(data, Iterable) and not callable(data):
        raise TypeError(f"data must be an iterable of batches or a function returning one, got {data!r}")
    return data
