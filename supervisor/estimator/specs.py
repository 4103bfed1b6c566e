"""`TrainSpec` and `EvalSpec`: what `train_and_evaluate` trains and evaluates (SPEC §10.2).

Validated at construction with TensorFlow's rules and messages (``Must specify max_steps > 0,
given: 0``), adapted to the runtime's types: hooks are `supervisor.Hook` instances, saving
listeners `hooks.CheckpointSaverListener` instances, exporters `Exporter` instances.

Example::

    train_spec = TrainSpec(train_input_fn, max_steps=10_000)
    eval_spec = EvalSpec(eval_input_fn, steps=50, exporters=[BestExporter()], throttle_secs=60)
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable

from hooks.checkpoint import CheckpointSaverListener
from supervisor import _validate as v
from supervisor.estimator.export.base import Exporter
from supervisor.hook import Hook

__all__ = ["TrainSpec", "EvalSpec", "validate_eval_name", "validate_input_fn", "validate_hooks",
           "validate_saving_listeners", "validate_exporters"]


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """The "train" part of `train_and_evaluate`.

    Args:
        input_fn: ``input_fn() -> iterable of batches``, called afresh for each training call.
        max_steps: the global step to train to (None: forever, or until ``input_fn``'s data
            ends).
        hooks: `supervisor.Hook` instances run on every training process.
        saving_listeners: `hooks.CheckpointSaverListener` instances for the chief's saves.
    """

    input_fn: Callable[[], Iterable[Any]]
    max_steps: int | None = None
    hooks: tuple[Hook, ...] = ()
    saving_listeners: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        validate_input_fn(self.input_fn)
        v.check_positive_or_none("max_steps", self.max_steps)
        object.__setattr__(self, "hooks", validate_hooks(self.hooks))
        object.__setattr__(self, "saving_listeners", validate_saving_listeners(self.saving_listeners))


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """The "eval" and "export" part of `train_and_evaluate`.

    Args:
        input_fn: ``input_fn() -> iterable of batches``, called afresh for each evaluation.
        steps: evaluate at most this many batches (None: until ``input_fn``'s data ends).
        name: evaluation name; metrics go to ``model_dir/eval_<name>`` (None: ``eval``).
        hooks: `supervisor.Hook` instances run during each evaluation.
        exporters: an `Exporter`, an iterable of them, or None; called after each evaluation.
        start_delay_secs: the evaluator task waits this long before its first evaluation.
        throttle_secs: do not start an evaluation sooner than this after the previous one
            started (local mode: checkpoints in between are not evaluated; the final one is).
    """

    input_fn: Callable[[], Iterable[Any]]
    steps: int | None = 100
    name: str | None = None
    hooks: tuple[Hook, ...] = ()
    exporters: tuple[Any, ...] = ()
    start_delay_secs: float = 120
    throttle_secs: float = 600

    def __post_init__(self) -> None:
        validate_input_fn(self.input_fn)
        v.check_positive_or_none("steps", self.steps)
        validate_eval_name(self.name)
        object.__setattr__(self, "hooks", validate_hooks(self.hooks))
        object.__setattr__(self, "exporters", validate_exporters(self.exporters))
        v.check_seconds("start_delay_secs", self.start_delay_secs)
        v.check_seconds("throttle_secs", self.throttle_secs)


def validate_eval_name(name: Any) -> None:
    """An evaluation name: None or a string usable in one directory name, ``eval_<name>``
    directly inside ``model_dir`` (no path separator, no NUL)."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"`name` must be string, given: {name!r}")
    if name and ("/" in name or os.sep in name or "\0" in name):
        raise ValueError(f"`name` must not contain '/' (the metrics go to model_dir/eval_<name>, one directory "
                         f"inside model_dir), given: {name!r}; e.g. name='holdout'")


def validate_input_fn(input_fn: Any) -> None:
    """``input_fn`` must be callable (TF's message)."""
    if not callable(input_fn):
        raise TypeError(f"`input_fn` must be callable, given: {input_fn!r}; pass a function returning "
                        "an iterable of batches, e.g. lambda: loader")


def validate_hooks(hooks: Any) -> tuple[Hook, ...]:
    """A tuple of `supervisor.Hook` instances (None: empty)."""
    hooks = v.as_tuple("hooks", hooks)
    for hook in hooks:
        if not isinstance(hook, Hook):
            raise TypeError(f"All hooks must be `supervisor.Hook` instances, given: {hook!r}")
    return hooks


def validate_saving_listeners(listeners: Any) -> tuple[Any, ...]:
    """A tuple of `hooks.CheckpointSaverListener` instances (None: empty)."""
    listeners = v.as_tuple("saving_listeners", listeners)
    for listener in listeners:
        if not isinstance(listener, CheckpointSaverListener):
            raise TypeError("All saving_listeners must be `hooks.CheckpointSaverListener` instances, "
                            f"given: {listener!r}")
    return listeners


def validate_exporters(exporters: Any) -> tuple[Any, ...]:
    """An `Exporter`, an iterable of them, or None, as a tuple of uniquely named exporters."""
    if isinstance(exporters, (str, bytes)):
        raise TypeError(f"`exporters` must be an Exporter, an iterable of Exporter, or `None`, given: {exporters!r}; "
                        "pass instances, e.g. exporters=[BestExporter()]")
    if not exporters:
        return ()
    if isinstance(exporters, Exporter):
        exporters = [exporters]
    try:
        exporters = tuple(exporters)
    except TypeError:
        exporters = (exporters,)
    names: list[Any] = []
    for exporter in exporters:
        if not isinstance(exporter, Exporter):
            raise TypeError(f"`exporters` must be an Exporter, an iterable of Exporter, or `None`, "
                            f"found {exporter!r}")
        if not exporter.name:
            raise ValueError("An Exporter cannot have a name that is `None` or empty. All exporter names: "
                             f"{[e.name for e in exporters]}")
        if not isinstance(exporter.name, str):
            raise ValueError(f"An Exporter must have a string name. Given: {type(exporter.name)}")
        if exporter.name in names:
            raise ValueError("`exporters` must have unique names. Such a name cannot be `None`. "
                             f"All exporter names: {[e.name for e in exporters]}")
        names.append(exporter.name)
    return exporters
