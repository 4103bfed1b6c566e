"""The checkpoint arguments every front door shares (`Supervisor`, `MonitoredTrainingSession`,
`SingularMonitoredSession`), checked at construction, and the formats they may name."""
from __future__ import annotations

import os
from typing import Any

from supervisor import _validate as v
from supervisor._paths import check_restore_step, is_url
from supervisor.checkpoint import check_capture, check_trusted_globals
from supervisor.checkpoint.layout.best import check_retention, refuse_for_sharded
from supervisor.checkpoint.tiers.options import check_tiers

__all__ = ["CHECKPOINT_FORMATS", "check_checkpoint_options", "pop_restore_step"]


def check_checkpoint_options(*, basename: Any, max_to_keep: Any, keep_checkpoint_every_n_hours: Any,
                             save_mode: Any, trusted_globals: Any = (), capture: Any = "auto",
                             lock: Any = "auto", lease_secs: Any = None,
                             storage_options: dict[str, Any] | None = None, logdir: str | None = None,
                             restore_step: Any = None, keep_best: Any = None, best_metric: Any = None,
                             best_mode: Any = "min", keep_period: Any = None, **tiers: Any) -> dict[str, Any]:
    """Validates the checkpoint arguments the front doors share, at their construction
    (``storage_options``: already checked with `supervisor._paths.check_storage`; ``logdir``: the
    checked checkpoint directory, which ``lock``/``lease_secs`` must suit; the retention ones:
    `supervisor.checkpoint.layout.best.check_retention`; ``tiers``: the checkpoint-tier arguments,
    `supervisor.checkpoint.tiers.options.check_tiers`)."""
    if not isinstance(basename, str) or not basename or os.sep in basename or basename.startswith("."):
        raise ValueError(f"checkpoint_basename must be a plain file name such as 'model.ckpt', got {basename!r}")
    if tiers.get("local_dir") is not None and (keep_best or keep_period):
        raise ValueError(f"keep_best/keep_period with local_dir (checkpoint tiers) is not supported yet, got "
                         f"keep_best={keep_best!r}, keep_period={keep_period!r}: drop local_dir to keep the best or every "
                         "N-th checkpoint in the logdir, or drop keep_best/keep_period")
    lock, lease_secs = v.check_lock(lock, lease_secs, logdir, object_store=logdir is not None and is_url(logdir))
    check_retention(max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                    keep_best=keep_best, best_metric=best_metric, best_mode=best_mode, keep_period=keep_period,
                    hours_allow_none=False)
    return {
        "lock": lock,
        "lease_secs": lease_secs,
        "basename": basename,
        "max_to_keep": max_to_keep,
        "keep_checkpoint_every_n_hours": keep_checkpoint_every_n_hours,
        "keep_best": keep_best, "best_metric": best_metric, "best_mode": best_mode, "keep_period": keep_period,
        "save_mode": v.check_choice("save_mode", save_mode, ("async", "sync")),
        "trusted_globals": check_trusted_globals(trusted_globals),
        "capture": check_capture(capture),
        "storage_options": storage_options,
        "restore_step": check_restore_step(restore_step, logdir, basename),
        **check_tiers(**tiers, logdir=logdir),
    }


#: The values of every front door's ``checkpoint_format`` (SPEC §12).
CHECKPOINT_FORMATS = ("torch", "dcp")


def pop_restore_step(options: dict[str, Any], checkpoint_format: str) -> Any:
    """Pops ``restore_step`` from ``options``: the chief's creator's (sharded checkpoints: not yet,
    nor ``keep_best``/``keep_period``, popped here for them)."""
    restore_step = options.pop("restore_step", None)
    if checkpoint_format == "dcp":
        refuse_for_sharded(options)
    if restore_step is not None and checkpoint_format == "dcp":
        raise ValueError("restore_step is not supported with checkpoint_format='dcp' yet; point the index at the "
                         "step with `python -m supervisor rollback LOGDIR STEP` instead")
    return restore_step
