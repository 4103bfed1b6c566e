"""Evaluation metrics: aggregation of step outputs and the eval event files (SPEC §9, §10.1).

- A metric is either the mean over evaluation batches of a scalar the ``eval_step`` returns
  (every batch weighs the same, as TF's ``tf.metrics.mean`` of a per-batch value), or an object
  with ``update(outputs, batch)``, ``compute()`` and ``reset()`` (torchmetrics-compatible, no
  dependency). A ``compute()`` returning a dict (torchmetrics' ``MetricCollection``, Keras'
  ``DictMetric``) gives one metric per key, tagged ``name/key`` (`flatten_metric`).
- Eval metrics are written with bare tags (``loss``, ``accuracy``) into ``model_dir/eval`` or
  ``eval_<name>``, at the evaluated checkpoint's step. Each evaluation appends one event to this
  process's events file in that directory and fsyncs it before returning, without a writer
  thread, so the early-stopping hooks of a trainer see the result as soon as it exists.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Mapping

import torch

__all__ = ["MeanAggregator", "check_metric_objects", "EvalEventsFile", "flatten_metric", "to_float"]

logger = logging.getLogger(__name__)

_METRIC_METHODS = ("update", "compute", "reset")


def check_metric_objects(metrics: Any) -> dict[str, Any]:
    """Validates ``metrics={name: obj}`` (None: none); each object needs update/compute/reset."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> metric object (with update(outputs, batch), "
                        f"compute() and reset()), got {metrics!r}")
    for name, obj in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"metric names must be non-empty strings, got {name!r}")
        missing = [m for m in _METRIC_METHODS if not callable(getattr(obj, m, None))]
        if missing:
            raise TypeError(f"metrics[{name!r}] must have update(outputs, batch), compute() and reset(); "
                            f"{type(obj).__name__} lacks {', '.join(missing)}")
    return dict(metrics)


def to_float(name: str, value: Any) -> float:
    """A metric value as a Python float; names the metric when it is not a scalar."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"eval metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}; "
                            "reduce it first, e.g. value.mean()")
        return float(value.detach().reshape(()).item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"eval metric {name!r} must be a number or a scalar tensor, got {value!r}") from None


def flatten_metric(name: str, value: Any) -> dict[str, float]:
    """A computed metric as ``{tag: float}``: a number or scalar tensor is ``{name: value}``; a
    mapping (Keras' ``DictMetric``, torchmetrics' ``MetricCollection``) is flattened into
    ``name/key`` tags, recursively (``{"errors/mse": 0.1, "errors/mae": 0.2}``). The one rule
    `Estimator.evaluate`, ``train_and_evaluate`` and `SidecarEvaluator` use."""
    if isinstance(value, Mapping):
        flat: dict[str, float] = {}
        for key, inner in value.items():
            flat.update(flatten_metric(f"{name}/{key}", inner))
        return flat
    return {name: to_float(name, value)}


class MeanAggregator:
    """Means of the scalars the evaluation steps return, accumulated without a host sync per step."""

    def __init__(self) -> None:
        self._sums: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    def add(self, outputs: Mapping[str, Any]) -> None:
        for name, value in outputs.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise TypeError(f"eval_step output {name!r} must be a scalar, got a tensor of shape "
                                    f"{tuple(value.shape)}; return value.mean() or a metric object")
                value = value.detach().reshape(()).double()
            self._sums[name] = self._sums.get(name, 0.0) + value
            self._counts[name] = self._counts.get(name, 0) + 1

    def result(self) -> dict[str, float]:
        return {name: to_float(name, total) / self._counts[name] for name, total in self._sums.items()}


class EvalEventsFile:
    """This process's events file in one eval directory; each `write` appends and fsyncs."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path: str | None = None

    def write(self, metrics: Mapping[str, float], step: int) -> None:
        """Writes ``metrics`` (bare tags) as one event at ``step``."""
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter

        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                  for tag, value in metrics.items()]
        records = []
        if self.path is None:
            os.makedirs(self.directory, exist_ok=True)
            self.path = os.path.join(self.directory, f"events.out.tfevents.{time.time():.6f}."
                                                     f"{socket.gethostname()}.{os.getpid()}.eval")
            records.append(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        records.append(event_pb2.Event(wall_time=time.time(), step=int(step),
                                       summary=summary_pb2.Summary(value=values)))
        with open(self.path, "ab") as f:
            writer = RecordWriter(f)
            for record in records:
                writer.write(record.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        logger.debug("wrote eval metrics of step %d to %s", step, self.path)
