"""Which checkpoints to keep (SPEC §5.5): pure functions of (checkpoints, times, history).

TensorFlow's ``CheckpointManager`` rules, step by step:

- retention manages the checkpoints it saved or found listed in the index (``checkpoints``,
  oldest first, each with its save time); anything else in the logdir is never touched;
- after a save, while more than ``max_to_keep`` are managed, the oldest leaves management: if it
  was saved at least ``keep_checkpoint_every_n_hours`` after the last preserved one, it is
  preserved for good (and becomes the new ``last_preserved_timestamp``), else it is deleted;
- ``max_to_keep=None`` keeps everything;
- the state survives restarts through the index (paths + timestamps + last preserved time).

Beyond TF (issue 34; Ignite's ``Checkpoint(score_function, n_saved)``, Orbax's ``best_fn`` and
``keep_period``): a checkpoint leaves management only when it is neither among the newest
``max_to_keep``, nor among the ``keep_best`` best by its recorded metric (``best_mode="min"``
or ``"max"``; a tie keeps the older; a checkpoint without a metric, or with NaN, is judged by
recency only), nor at a step that is a multiple of ``keep_period`` (kept forever, listed in the
index). A best checkpoint that a better one displaces later leaves then (deleted, or preserved by
the hours rule). The metrics are recorded in the index beside the timestamps (`to_index`).

No clock, no filesystem: the manager applies the decisions (deleting only after a newer commit),
and tests drive these functions with synthetic histories.

Example::

    state = recover(None, now=0.0)
    for step in range(1, 8):
        state = record(state, f"model.ckpt-{step}", timestamp=step * 3600.0)
        result = sweep(state, max_to_keep=5, keep_checkpoint_every_n_hours=2.0)
        state = result.state   # result.delete: names to delete now
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Collection, Mapping

from supervisor.checkpoint.layout.index import CheckpointState

__all__ = ["RetentionRule", "RetentionState", "SweepResult", "hold", "recover", "record", "sweep", "to_index",
           "kept_reasons", "with_metric", "rule_of"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionState:
    """Managed checkpoints ``(name, saved_timestamp)``, oldest first, and the time of the last
    checkpoint preserved by ``keep_checkpoint_every_n_hours``."""

    checkpoints: tuple[tuple[str, float], ...]
    last_preserved_timestamp: float
    #: ``{name: metric}`` of the managed checkpoints that have one (`RetentionRule.keep_best`).
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.checkpoints)


@dataclass(frozen=True)
class RetentionRule:
    """The retention options a writer applies (and records in the index, so that ``ls`` can say
    why each checkpoint is kept). ``best_metric``: the name the metrics were computed by (a
    restart with another name forgets the recorded values)."""

    max_to_keep: int | None = 5
    keep_checkpoint_every_n_hours: float | None = 10000.0
    keep_best: int | None = None
    best_mode: str = "min"
    keep_period: int | None = None
    best_metric: str | None = None

    def sweep(self, state: RetentionState) -> SweepResult:
        return sweep(state, max_to_keep=self.max_to_keep, keep_best=self.keep_best, best_mode=self.best_mode,
                     keep_checkpoint_every_n_hours=self.keep_checkpoint_every_n_hours, keep_period=self.keep_period)

    @property
    def recorded(self) -> bool:
        """Whether the index records this rule (only when it goes beyond TF's)."""
        return bool(self.keep_best or self.keep_period)


@dataclass(frozen=True)
class SweepResult:
    """What a sweep decided: the new state, what to delete now, what is kept for good."""

    state: RetentionState
    delete: tuple[str, ...] = ()
    preserve: tuple[str, ...] = ()


def recover(index: CheckpointState | None, now: float, *, present: Collection[str] | None = None,
            best_metric: str | None = None, keep_period: int | None = None) -> RetentionState:
    """Rebuilds the state from the index at start-up (TF ``CheckpointManager.__init__``).

    Args:
        index: the index with paths relative to the logdir (or None when there is none).
        now: the current wall time; timestamps in the future are clamped to it, so a clock that
            went backwards cannot get old checkpoints deleted.
        present: the names that exist on disk; listed names not in it are dropped (they were
            deleted by a retention pass that crashed before rewriting the index).
        best_metric: the name of the metric the writer ranks by; the index's recorded metrics
            are kept only when they were computed by that name (or the index names none).
        keep_period: a listed checkpoint at a multiple of it, or with a recorded metric, stays
            managed even when saved before the last preserved one (it is listed because it is
            kept; it must stay rankable and listed).
    """
    if index is None:
        # A second before now: a manager re-created at once must not preserve its first save.
        return RetentionState((), now - 1.0)
    last_preserved = index.last_preserved_timestamp
    if last_preserved is None:
        last_preserved = now - 1.0
    if now < last_preserved:
        logger.warning("the checkpoint index's last_preserved_timestamp %.1f is in the future "
                       "(now %.1f); the system clock may have gone backwards", last_preserved, now)
        last_preserved = now
    paths = index.all_model_checkpoint_paths
    timestamps = index.all_model_checkpoint_timestamps
    if len(timestamps) != len(paths):
        timestamps = (last_preserved,) * len(paths)
    metrics = _recorded_metrics(index, best_metric)
    held = set(metrics) | period_names(paths, keep_period)
    managed: dict[str, float] = {}
    for name, timestamp in zip(paths, timestamps, strict=True):
        timestamp = min(timestamp, now)
        if (timestamp > last_preserved or name in held) and (present is None or name in present):
            managed.pop(name, None)
            managed[name] = timestamp
    return RetentionState(tuple(managed.items()), last_preserved, {n: m for n, m in metrics.items() if n in managed})


def _recorded_metrics(index: CheckpointState, best_metric: str | None) -> dict[str, float]:
    metrics = index.all_model_checkpoint_metrics
    if len(metrics) != len(index.all_model_checkpoint_paths):
        return {}
    if best_metric is not None and index.best_metric is not None and index.best_metric != best_metric:
        logger.warning("the checkpoint index records metrics of %r, but best_metric is %r now: the recorded "
                       "values are forgotten and the checkpoints they made best follow max_to_keep from now on",
                       index.best_metric, best_metric)
        return {}
    return {name: float(value) for name, value in zip(index.all_model_checkpoint_paths, metrics, strict=True)
            if math.isfinite(value)}


def record(state: RetentionState, name: str, timestamp: float) -> RetentionState:
    """Adds a newly committed checkpoint as the newest (re-saving a name moves it to the end)."""
    managed = [(n, t) for n, t in state.checkpoints if n != name]
    managed.append((name, float(timestamp)))
    metrics = {n: m for n, m in state.metrics.items() if n != name}
    return RetentionState(tuple(managed), state.last_preserved_timestamp, metrics)


def with_metric(state: RetentionState, name: str, metric: float | None) -> RetentionState:
    """``state`` with ``metric`` recorded for the managed checkpoint ``name`` (None or NaN: no
    metric); unchanged when ``name`` is not managed."""
    if name not in state.names:
        return state
    metrics = {n: m for n, m in state.metrics.items() if n != name}
    if metric is not None and math.isfinite(metric):
        metrics[name] = float(metric)
    return RetentionState(state.checkpoints, state.last_preserved_timestamp, metrics)


def sweep(state: RetentionState, *, max_to_keep: int | None, keep_checkpoint_every_n_hours: float | None,
          keep_best: int | None = None, best_mode: str = "min", keep_period: int | None = None) -> SweepResult:
    """Decides which managed checkpoints leave management (TF ``CheckpointManager._sweep``, plus
    the best ``keep_best`` and every ``keep_period``-th step, which stay managed)."""
    if not max_to_keep:
        return SweepResult(state)
    held = best_names(state, keep_best, best_mode) | period_names(state.names, keep_period)
    newest = set(state.names[-max_to_keep:])
    last_preserved = state.last_preserved_timestamp
    kept: list[tuple[str, float]] = []
    delete: list[str] = []
    preserve: list[str] = []
    for name, timestamp in state.checkpoints:
        if name in newest or name in held:
            kept.append((name, timestamp))
        elif keep_checkpoint_every_n_hours and (
                timestamp - keep_checkpoint_every_n_hours * 3600.0 >= last_preserved):
            last_preserved = timestamp
            preserve.append(name)
        else:
            delete.append(name)
    names = {n for n, _ in kept}
    metrics = {n: m for n, m in state.metrics.items() if n in names}
    return SweepResult(RetentionState(tuple(kept), last_preserved, metrics), tuple(delete), tuple(preserve))


def hold(result: SweepResult, before: RetentionState, held: Collection[str]) -> SweepResult:
    """``result`` without deleting the ``held`` names (a checkpoint tier's copy in flight): they
    stay managed, oldest first, and leave at a later sweep once no longer held."""
    kept = [n for n in result.delete if n in held]
    if not kept:
        return result
    again = tuple((n, t) for n, t in before.checkpoints if n in kept)
    return SweepResult(RetentionState(again + result.state.checkpoints, result.state.last_preserved_timestamp,
                                      {**{n: m for n, m in before.metrics.items() if n in kept}, **result.state.metrics}),
                       tuple(n for n in result.delete if n not in held), result.preserve)


def best_names(state: RetentionState, keep_best: int | None, best_mode: str = "min") -> set[str]:
    """The ``keep_best`` managed checkpoints with the best metric (a tie keeps the older)."""
    if not keep_best:
        return set()
    sign = 1.0 if best_mode == "min" else -1.0
    ranked = sorted(((sign * state.metrics[n], i, n) for i, n in enumerate(state.names) if n in state.metrics))
    return {n for _, _, n in ranked[:keep_best]}


_STEP = re.compile(r"-(\d+)$")


def period_names(names: Collection[str], keep_period: int | None) -> set[str]:
    """The names whose step (``<basename>-<step>``) is a multiple of ``keep_period``."""
    if not keep_period:
        return set()
    return {n for n in names if (m := _STEP.search(n)) is not None and int(m.group(1)) % keep_period == 0}


def kept_reasons(state: RetentionState, rule: RetentionRule) -> dict[str, tuple[str, ...]]:
    """Why each managed checkpoint is kept: ``"newest"`` (among the newest ``max_to_keep``; every
    one when it is None), ``"best"``, ``"period"`` (what ``ls`` shows)."""
    newest = set(state.names if not rule.max_to_keep else state.names[-rule.max_to_keep:])
    best = best_names(state, rule.keep_best, rule.best_mode)
    period = period_names(state.names, rule.keep_period)
    return {n: tuple(r for r, ok in (("newest", n in newest), ("best", n in best), ("period", n in period)) if ok)
            for n in state.names}


def to_index(state: RetentionState, latest: str, rule: RetentionRule | None = None) -> CheckpointState:
    """The index that records ``state`` with ``latest`` as the checkpoint to restore; with
    ``rule`` beyond TF's (`RetentionRule.recorded`), the rule and each checkpoint's metric (NaN:
    none) too."""
    recorded = rule is not None and rule.recorded
    return CheckpointState(
        model_checkpoint_path=latest,
        all_model_checkpoint_paths=state.names,
        all_model_checkpoint_timestamps=tuple(t for _, t in state.checkpoints),
        last_preserved_timestamp=state.last_preserved_timestamp,
        all_model_checkpoint_metrics=tuple(state.metrics.get(n, math.nan) for n in state.names)
        if recorded and state.metrics else (),
        **(_rule_fields(rule) if recorded else {}),
    )


def _rule_fields(rule: RetentionRule) -> dict:
    return {"max_to_keep": rule.max_to_keep, "keep_best": rule.keep_best, "keep_period": rule.keep_period,
            "best_mode": rule.best_mode if rule.keep_best else None,
            "best_metric": rule.best_metric if rule.keep_best else None}


def rule_of(index: CheckpointState) -> RetentionRule | None:
    """The rule an index records (None: TF's rule, not recorded)."""
    if not (index.keep_best or index.keep_period):
        return None
    return RetentionRule(max_to_keep=index.max_to_keep, keep_checkpoint_every_n_hours=None,
                         keep_best=index.keep_best, best_mode=index.best_mode or "min",
                         keep_period=index.keep_period, best_metric=index.best_metric)
