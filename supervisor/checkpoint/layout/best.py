"""Keeping the best checkpoints by a metric, and every N-th step (issue 34; SPEC §5.5).

What a checkpoint of step N is judged by: the metrics an evaluation reported for step N
(`hooks.EvaluationHook` reports each evaluation to the session's manager and, with
``keep_best``, asks for a checkpoint at that step, so every evaluated model is a candidate), or —
in a session without an evaluation hook — the scalars of step N's outputs (what ``s.run``
returned: a dict of scalars, or one scalar, named ``loss``). The two are never mixed: once an
evaluation announced itself (`MetricKeeper.expect_evaluation`), step outputs are ignored, so a
training loss can never compete with an evaluation loss. ``best_metric`` names the metric (a key
of those metrics) or is a callable ``fn(metrics) -> float``. A checkpoint without its metric (no
evaluation at its step, the name missing, NaN) follows ``max_to_keep`` only.

The value is recorded in the index with the checkpoint (`retention.to_index`), so a restarted
writer keeps the same best ones; a metric reported after its checkpoint committed (an evaluation
at the end, after the final save) is recorded then (`CheckpointManager.report_metrics`).
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Mapping

import torch

from supervisor._validate import check_choice, check_int, check_number
from supervisor.checkpoint.layout.format import checkpoint_name
from supervisor.checkpoint.layout.retention import RetentionRule

__all__ = ["MetricKeeper", "ReportsMetrics", "check_retention", "metric_name", "refuse_for_sharded"]

logger = logging.getLogger(__name__)

SOURCES = ("evaluation", "outputs")


def check_retention(*, max_to_keep: Any, keep_checkpoint_every_n_hours: Any, keep_best: Any = None,
                    best_metric: Any = None, best_mode: Any = "min", keep_period: Any = None,
                    hours_allow_none: bool = True) -> RetentionRule:
    """Validates the retention arguments (messages name the argument, the value and the fix)."""
    keep_best = check_int("keep_best", keep_best, minimum=1, allow_none=True)
    if keep_best is not None and best_metric is None:
        raise ValueError(f"keep_best={keep_best} needs best_metric=: the name of a metric the evaluation (or the "
                         "step's outputs) reports, e.g. best_metric='loss', or a function metrics -> float")
    if best_metric is not None and not (callable(best_metric) or (isinstance(best_metric, str) and best_metric)):
        raise TypeError(f"best_metric must be a metric name such as 'loss' or a function metrics -> float, "
                        f"got {best_metric!r}")
    if best_metric is not None and keep_best is None:
        raise ValueError(f"best_metric={best_metric!r} is used only with keep_best=K (how many best checkpoints "
                         "to keep); give keep_best too, or leave best_metric out")
    return RetentionRule(
        max_to_keep=check_int("max_to_keep", max_to_keep, minimum=1, allow_none=True),
        keep_checkpoint_every_n_hours=check_number("keep_checkpoint_every_n_hours", keep_checkpoint_every_n_hours,
                                                   strictly_positive=True, allow_none=hours_allow_none),
        keep_best=keep_best, best_mode=check_choice("best_mode", best_mode, ("min", "max")),
        keep_period=check_int("keep_period", keep_period, minimum=1, allow_none=True),
        best_metric=metric_name(best_metric))


def metric_name(best_metric: Any) -> str | None:
    """How the index names ``best_metric``: the name itself, or a function's qualified name."""
    if best_metric is None or isinstance(best_metric, str):
        return best_metric
    return f"{getattr(best_metric, '__module__', '?')}.{getattr(best_metric, '__qualname__', repr(best_metric))}"


class MetricKeeper:
    """The metrics reported for the steps not yet saved, and how a checkpoint's value is computed.

    Thread-safe: reports come from the training thread, the values are taken by the writer thread.
    """

    def __init__(self, best_metric: str | Callable[[Mapping[str, Any]], Any] | None) -> None:
        self.best_metric = best_metric
        self._pending: dict[int, tuple[str, float | None]] = {}
        self._ready: dict[str, float] = {}
        self._evaluated = False
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    @property
    def wanted(self) -> bool:
        """Whether checkpoints are judged by a metric (``keep_best``)."""
        return self.best_metric is not None

    def expect_evaluation(self) -> None:
        """An evaluation reports this session's metrics: step outputs are ignored from now on."""
        self._evaluated = True

    def value(self, metrics: Any, source: str) -> float | None:
        """The checkpoint's value from ``metrics`` (None: no value, or this source is ignored)."""
        if not self.wanted or (source == "outputs" and self._evaluated):
            return None
        if not isinstance(metrics, Mapping):
            metrics = {"loss": metrics}
        if callable(self.best_metric):
            return _finite(self.best_metric(dict(metrics)), "best_metric's result")
        if self.best_metric not in metrics:
            self._warn_missing(source, metrics)
            return None
        return _finite(metrics[self.best_metric], f"the metric {self.best_metric!r}", strict=source == "evaluation")

    def note(self, step: int, value: float | None, source: str) -> None:
        """Keeps ``value`` for the save of ``step``; an evaluation's value wins over the outputs'."""
        with self._lock:
            if source == "outputs" and self._pending.get(step, ("",))[0] == "evaluation":
                return
            self._pending = {s: v for s, v in self._pending.items() if s >= step}
            self._pending[step] = (source, value)

    def take(self, step: int, name: str) -> None:
        """At the save of ``step``: its value becomes ``name``'s (what `pop` returns at publish)."""
        with self._lock:
            _, value = self._pending.pop(step, ("", None))
            self._pending = {s: v for s, v in self._pending.items() if s > step}
            if value is not None:
                self._ready[name] = value

    def pop(self, name: str) -> float | None:
        with self._lock:
            return self._ready.pop(name, None)

    def _warn_missing(self, source: str, metrics: Mapping[str, Any]) -> None:
        if source in self._warned:
            return
        self._warned.add(source)
        where = "the evaluation's metrics" if source == "evaluation" else "the step's outputs"
        logger.warning("best_metric=%r is not among %s (%s): those checkpoints follow max_to_keep only; name one "
                       "of them, or pass a function metrics -> float", self.best_metric, where,
                       ", ".join(sorted(map(str, metrics))) or "none")


def _finite(value: Any, what: str, strict: bool = True) -> float | None:
    """``value`` as a float; None for NaN/inf (judged by recency) or, unless ``strict``, a
    value that is not a scalar."""
    try:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TypeError(f"{what} must be a scalar, got a tensor of shape {tuple(value.shape)}")
            value = value.detach().reshape(()).item()
        number = float(value)
    except (TypeError, ValueError) as e:
        if not strict:
            return None
        raise TypeError(f"{what} must be a number or a scalar tensor to rank checkpoints by (best_metric), "
                        f"got {value!r}") from e
    return number if math.isfinite(number) else None


class ReportsMetrics:
    """`CheckpointManager`'s metric reports (a mixin over its ``_metrics``, ``_publisher``,
    ``_writer``, ``_settle``, ``_last_saved_step``, ``basename``, ``is_open``, ``remove_dropped``)."""

    _metrics: MetricKeeper
    _publisher: Any
    _writer: Any
    _last_saved_step: int | None
    basename: str

    @property
    def metrics(self) -> MetricKeeper:
        """How checkpoints are judged by a metric (``keep_best``; see the module)."""
        return self._metrics

    def report_metrics(self, step: int, metrics: Any, *, source: str = "evaluation") -> None:
        """Reports the metrics of the model at ``step`` (``source``: ``"evaluation"``, or ``"outputs"``:
        the step's outputs, ignored once an evaluation announced itself); with ``keep_best`` they rank the
        checkpoint of that step — saved later, or already saved (then recorded in the index now, once
        the save in flight is published; nothing when retention deleted it already). A no-op without
        ``keep_best``."""
        value = self._metrics.value(metrics, check_choice("source", source, SOURCES))
        if value is None:
            return
        saved = self._last_saved_step
        if saved is not None and step <= saved and getattr(self, "is_open", False):
            self._settle()  # type: ignore[attr-defined]
            self._writer.wait()  # the save of this step is published: record the value with it
            if self._publisher.record_metric(checkpoint_name(self.basename, step), value):
                self.remove_dropped()  # type: ignore[attr-defined]
        else:
            self._metrics.note(step, value, source)


def refuse_for_sharded(options: dict[str, Any]) -> None:
    """Pops the retention options sharded checkpoints do not take yet; refuses them when given."""
    extras = {k: options.pop(k, None) for k in ("keep_best", "best_metric", "best_mode", "keep_period")}
    given = [f"{k}={v!r}" for k, v in extras.items() if v is not None and k != "best_mode"]
    if given:
        raise ValueError(f"{', '.join(given)} is not supported with checkpoint_format='dcp' yet; leave it out, or use "
                         "checkpoint_format='torch'")
