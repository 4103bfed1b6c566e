"""Evaluation metrics: aggregation of step outputs and the eval event files (SPEC §9, §10.1).

- A metric is either the mean over evaluation batches of a scalar the ``eval_step`` returns
  (every batch weighs the same, as TF's ``tf.metrics.mean`` of a per-batch value), or an object
  with ``update(outputs, batch)``, ``compute()`` and ``reset()`` (torchmetrics-compatible, no
  dependency). A ``compute()`` returning a dict (torchmetrics' ``MetricCollection``, Keras'
  ``DictMetric``) gives one metric per key, tagged ``name/key`` (`flatten_metric`).
- The eval events files live in `supervisor.events` (`EvalEventsFile` writes, `read_eval_events`
  is its one reader, `read_scalars`); re-exported here, where they were first.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import torch

from supervisor.events import EVENTS_PREFIX, EvalEventsFile, open_regular_file
from supervisor.metrics import MeanAggregator, check_metric_objects, flatten_metric, to_float
from supervisor.events import read_scalars as read_eval_events

__all__ = ["MeanAggregator", "check_metric_objects", "EvalEventsFile", "flatten_metric", "read_eval_events",
           "to_float", "EVENTS_PREFIX", "open_regular_file"]

logger = logging.getLogger(__name__)

