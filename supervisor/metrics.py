"""Evaluation metrics, the one rule every evaluator uses (`EvaluationHook`, `Estimator.evaluate`,
``train_and_evaluate``, `SidecarEvaluator`): the mean over batches of each scalar an
``eval_step`` returns, and metric objects with ``update(outputs, batch)``/``compute()``/``reset()``
(torchmetrics-compatible, no dependency) whose dict results are flattened into ``name/key`` tags."""
from __future__ import annotations

from typing import Any, Mapping

import torch

__all__ = ["MeanAggregator", "check_metric_objects", "flatten_metric", "to_float"]

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
