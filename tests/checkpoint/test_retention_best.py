"""keep_best / best_mode / keep_period (issue 34 item 2): the pure rules on synthetic histories,
then the manager on real files (the metric recorded in the index, surviving a new manager)."""
from __future__ import annotations

import math
import os

import pytest

from supervisor.checkpoint import CheckpointManager, get_checkpoint_state
from supervisor.checkpoint.layout.index import format_index, parse_index
from supervisor.checkpoint.layout.retention import (RetentionRule, RetentionState, kept_reasons, record, recover, sweep,
                                             to_index, with_metric)

from .conftest import small_state


def _run(history, **rule):
    """record + metric + sweep per (step, metric); returns (deleted, preserved, managed steps)."""
    state = RetentionState((), -1.0)
    deleted, preserved = [], []
    rule = {"keep_checkpoint_every_n_hours": None, **rule}
    for step, metric in history:
        name = f"model.ckpt-{step}"
        result = sweep(with_metric(record(state, name, float(step)), name, metric), **rule)
        deleted += [int(n.rsplit("-", 1)[1]) for n in result.delete]
        preserved += [int(n.rsplit("-", 1)[1]) for n in result.preserve]
        state = result.state
    return deleted, preserved, [int(n.rsplit("-", 1)[1]) for n in state.names]


LOSSES = [(1, 0.9), (2, 0.3), (3, 0.5), (4, 0.2), (5, 0.8), (6, 0.7)]

CASES = [
    # id, history, rule, deleted, preserved, managed at the end
    ("recency only", LOSSES, dict(max_to_keep=1), [1, 2, 3, 4, 5], [], [6]),
    ("best 2 by min survive recency", LOSSES, dict(max_to_keep=1, keep_best=2),
     [1, 3, 5], [], [2, 4, 6]),
    ("best 2 by max", LOSSES, dict(max_to_keep=1, keep_best=2, best_mode="max"),
     [2, 3, 4], [], [1, 5, 6]),
    ("no metric: recency only", [(1, None), (2, None), (3, 0.1), (4, None)], dict(max_to_keep=1, keep_best=1),
     [1, 2], [], [3, 4]),
    ("NaN is no metric", [(1, math.nan), (2, 0.5), (3, math.nan)], dict(max_to_keep=1, keep_best=1),
     [1], [], [2, 3]),
    ("a tie keeps the older", [(1, 0.5), (2, 0.5), (3, 0.9)], dict(max_to_keep=1, keep_best=1), [2], [], [1, 3]),
    ("keep_period keeps every 3rd step forever", [(s, None) for s in range(1, 8)], dict(max_to_keep=1, keep_period=3),
     [1, 2, 4, 5], [], [3, 6, 7]),
    ("period and best together", LOSSES, dict(max_to_keep=1, keep_best=1, keep_period=5),
     [1, 2, 3], [], [4, 5, 6]),
    ("max_to_keep=None keeps all", LOSSES, dict(max_to_keep=None, keep_best=1), [], [], [1, 2, 3, 4, 5, 6]),
]


@pytest.mark.parametrize("history, rule, deleted, preserved, managed", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_sweep_table(history, rule, deleted, preserved, managed):
    assert _run(history, **rule) == (deleted, preserved, managed)


def test_a_displaced_best_falls_to_the_hours_rule():
    """Leaving the best later, a checkpoint is preserved by keep_checkpoint_every_n_hours if due."""
    history = [(3700, 0.1), (3701, 0.9), (3702, 0.05)]
    assert _run(history, max_to_keep=1, keep_best=1, keep_checkpoint_every_n_hours=1.0) == ([3701], [3700], [3702])


def test_kept_reasons():
    state = RetentionState(tuple((f"m-{s}", float(s)) for s in (3, 4, 5, 6)), 0.0, {"m-4": 0.1, "m-6": 0.5})
    rule = RetentionRule(max_to_keep=1, keep_best=1, keep_period=3)
    assert kept_reasons(state, rule) == {"m-3": ("period",), "m-4": ("best",), "m-5": (), "m-6": ("newest", "period")}


def test_metrics_and_rule_round_trip_through_the_index_text():
    rule = RetentionRule(max_to_keep=1, keep_best=2, best_mode="max", keep_period=10, best_metric="acc")
    state = RetentionState((("model.ckpt-1", 1.5), ("model.ckpt-2", 2.5)), 0.5, {"model.ckpt-1": 0.75})
    index = parse_index(format_index(to_index(state, "model.ckpt-2", rule)))
    assert index.all_model_checkpoint_metrics[0] == 0.75 and math.isnan(index.all_model_checkpoint_metrics[1])
    assert (index.max_to_keep, index.keep_best, index.best_mode, index.keep_period, index.best_metric) == (
        1, 2, "max", 10, "acc")
    assert recover(index, now=10.0, best_metric="acc") == state
    assert recover(index, now=10.0, best_metric="loss").metrics == {}  # another metric: values forgotten


def test_tf_rule_writes_the_index_as_before():
    state = RetentionState((("model.ckpt-1", 1.5),), 0.5, {})
    assert format_index(to_index(state, "model.ckpt-1", RetentionRule(max_to_keep=3))) == (
        'model_checkpoint_path: "model.ckpt-1"\nall_model_checkpoint_paths: "model.ckpt-1"\n'
        'all_model_checkpoint_timestamps: 1.5\nlast_preserved_timestamp: 0.5\n')


# ---------------------------------------------------------------- on disk
def _steps(logdir):
    return sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(logdir) if n.startswith("model.ckpt-"))


def test_manager_keeps_the_best_across_a_new_manager(tmp_path, clock):
    logdir, state = tmp_path / "logdir", small_state()
    options = dict(max_to_keep=1, keep_best=2, best_metric="loss", clock=clock)
    with CheckpointManager(logdir, **options) as manager:
        for step, loss in [(1, 0.9), (2, 0.2), (3, 0.5), (4, 0.1), (5, 0.8)]:
            clock.advance(1)
            manager.report_metrics(step, {"loss": loss, "acc": 1 - loss})
            manager.save(step, state, wait=True)
    assert _steps(logdir) == [2, 4, 5]
    index = get_checkpoint_state(logdir)
    assert index.all_model_checkpoint_metrics == (0.2, 0.1, 0.8) and index.best_metric == "loss"
    with CheckpointManager(logdir, **options) as manager:
        for step in (6, 7):
            clock.advance(1)
            manager.save(step, state, wait=True)  # no metric: recency only
        manager.report_metrics(7, {"loss": 0.15})  # after its commit: recorded now, displaces 2
    assert _steps(logdir) == [4, 7]


def test_keep_period_on_disk(tmp_path, clock):
    logdir, state = tmp_path / "logdir", small_state()
    with CheckpointManager(logdir, max_to_keep=2, keep_period=3, clock=clock) as manager:
        for step in range(1, 9):
            clock.advance(1)
            manager.save(step, state, wait=True)
    assert _steps(logdir) == [3, 6, 7, 8]


BAD = [
    (dict(keep_best=2), ValueError, "keep_best=2 needs best_metric="),
    (dict(keep_best=0, best_metric="loss"), ValueError, "keep_best"),
    (dict(best_metric="loss"), ValueError, "best_metric='loss' is used only with keep_best"),
    (dict(keep_best=1, best_metric=5), TypeError, "best_metric must be a metric name"),
    (dict(keep_best=1, best_metric="loss", best_mode="lowest"), ValueError, "best_mode"),
    (dict(keep_period=0), ValueError, "keep_period"),
    (dict(keep_period=2.5), ValueError, "keep_period must be a positive integer or None, got 2.5"),
]


@pytest.mark.parametrize("options, error, words", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_options_are_refused_at_construction(tmp_path, options, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace("[", r"\[")) as info:
        CheckpointManager(tmp_path / "logdir", **options)
    assert str(info.value)


def test_recover_keeps_the_best_and_period_ones_listed_before_the_last_preserved():
    """A best (or period) checkpoint older than the last one preserved by the hours rule stays
    managed at a restart: still ranked, still listed (TF's rule alone would drop it)."""
    index = to_index(RetentionState((("m-3", 10.0), ("m-4", 20.0), ("m-9", 90.0)), 50.0, {"m-4": 0.1}), "m-9",
                     RetentionRule(max_to_keep=1, keep_best=1, keep_period=3, best_metric="loss"))
    state = recover(index, now=100.0, best_metric="loss", keep_period=3)
    assert state.names == ("m-3", "m-4", "m-9") and state.metrics == {"m-4": 0.1}
    assert recover(index, now=100.0).names == ("m-4", "m-9")  # without the period: only the ranked one
