"""Warm starting an `Estimator` (TF's ``warm_start_from`` / ``WarmStartSettings``).

``Estimator(..., warm_start_from=...)`` initialises the model from another run's checkpoint when
training starts on a ``model_dir`` that holds no checkpoint yet (a resume restores its own
checkpoint and never warm-starts again, as in TF). It is the session's ``init_fn`` running
`supervisor.restore_partial`: the keys of the checkpoint's ``model`` entry that match
``vars_to_warm_start`` (glob patterns on the model's state-dict keys, e.g. ``"encoder.*"``; None:
every key) and not ``exclude``, that the model has with the same shape, are loaded; the others
keep their initial values and are listed in an INFO line. The optimizer and the other state
start fresh (TF warm-started variables, never the optimizer's slots by default).

The source may be a checkpoint (``runs/pretrain/model.ckpt-9000``), a log directory (its latest
checkpoint), a file saved with ``torch.save(model.state_dict(), path)``, or the ``s3://`` URL of
any of those; its client's options are ``WarmStartSettings.storage_options``, else the
`RunConfig`'s (those of ``model_dir``'s object store) when the source is a URL.

Example::

    est = Estimator("runs/finetune", model=net, optimizer=opt, train_step=train_step,
                    warm_start_from=WarmStartSettings("s3://models/pretrain", vars_to_warm_start="encoder.*"))
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Iterable, Mapping

import torch

from supervisor.checkpoint import resolve_checkpoint, restore_partial
from supervisor.checkpoint.storage import Location, resolve_location

__all__ = ["WarmStartSettings", "check_warm_start", "warm_start_fn"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """Where and what to warm-start from (see the module docstring).

    Args:
        ckpt_to_initialize_from: a checkpoint, a log directory, a ``torch.save``'d state dict, or
            the URL of one.
        vars_to_warm_start: glob pattern(s) of the model's state-dict keys to load (None: all).
        exclude: glob pattern(s) of keys not to load.
        storage_options: the object-store client's options for a URL source (None: the
            `RunConfig`'s).
    """

    ckpt_to_initialize_from: str | os.PathLike
    vars_to_warm_start: str | Iterable[str] | None = None
    exclude: str | Iterable[str] | None = None
    storage_options: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        source = self.ckpt_to_initialize_from
        if not isinstance(source, (str, os.PathLike)) or not os.fspath(source):
            raise TypeError(f"ckpt_to_initialize_from must be a non-empty checkpoint path or URL, got {source!r}")
        object.__setattr__(self, "ckpt_to_initialize_from", os.fspath(source))


def check_warm_start(value: Any) -> WarmStartSettings | None:
    """``warm_start_from`` as `WarmStartSettings` (a path or URL becomes one), or None."""
    if value is None or isinstance(value, WarmStartSettings):
        return value
    if isinstance(value, (str, os.PathLike)):
        return WarmStartSettings(value)
    raise TypeError(f"warm_start_from must be a checkpoint path or URL, a WarmStartSettings or None, got {value!r}")


def warm_start_fn(settings: WarmStartSettings, model: torch.nn.Module,
                  locate: Callable[[str], Location]) -> Callable[[Any], None]:
    """The ``init_fn`` that warm-starts ``model`` as ``settings`` say; ``locate``: the estimator's
    (`Estimator.locate`: the `RunConfig`'s client, for a source without options of its own). The
    source is resolved once, when the warm start runs, and read through that one storage."""
    source = os.fspath(settings.ckpt_to_initialize_from)

    def init_fn(session: Any) -> None:
        options = settings.storage_options
        location = locate(source) if options is None else resolve_location(source, options or None)
        path = resolve_checkpoint(location)
        report = restore_partial(Location(path, location.storage), model, include=settings.vars_to_warm_start,
                                 exclude=settings.exclude)
        logger.info("warm-started from %s: %s", path, report)

    return init_fn
