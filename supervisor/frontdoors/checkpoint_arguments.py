"""The checkpoint arguments every front door shares (`Supervisor`, `MonitoredTrainingSession`,
`SingularMonitoredSession`), checked at construction into one frozen record, `CheckpointOptions`,
and the formats they may name. Where the checkpoints go is not an option: the front door resolves
it once into a `supervisor.checkpoint.storage.Location` (``storage_options`` end there)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from supervisor import _validate as v
from supervisor._paths import check_restore_step, is_url
from supervisor.clock import Clock, resolve_clock, system_clock
from supervisor.checkpoint import check_capture, check_trusted_globals
from supervisor.checkpoint.layout.best import check_retention, refuse_for_sharded
from supervisor.checkpoint.layout.format_registry import writable_format
from supervisor.checkpoint.tiers.options import check_peer_replicas, check_tiers

__all__ = ["SHARDED_FORMAT", "CheckpointOptions", "check_checkpoint_format", "check_checkpoint_options"]

#: The ``checkpoint_format`` every rank writes its shards of (SPEC §12): the sharded manager's,
#: where every other registered format is `CheckpointManager`'s, written by the chief.
SHARDED_FORMAT = "dcp"


def check_checkpoint_format(checkpoint_format: Any) -> str:
    """``checkpoint_format`` checked at a front door's construction: `SHARDED_FORMAT`, or a format
    of the registry that `CheckpointManager` writes (`format_registry.writable_format`: the
    entry-point group is read for a name not registered yet). A `ValueError` names the argument,
    the value, the registered formats and how to register one; a `TypeError` a value not a str."""
    if not isinstance(checkpoint_format, str):
        raise TypeError(f"checkpoint_format must be a str naming a registered checkpoint format ('torch', "
                        f"'safetensors', 'dcp', ...), got {checkpoint_format!r}")
    if checkpoint_format == SHARDED_FORMAT:
        return checkpoint_format
    return writable_format(checkpoint_format).name


@dataclass(frozen=True)
class CheckpointOptions:
    """The checkpoint arguments a front door was given, checked (`check_checkpoint_options`):
    what the session creator hands the checkpoint manager, read by attribute. Each field is the
    front-door argument of that name (``basename``: ``checkpoint_basename``), checked:
    ``lock``/``lease_secs`` against the logdir, ``trusted_globals`` a tuple, ``local_dir`` absolute
    and the persist interval pair resolved (`supervisor.checkpoint.tiers.options.check_tiers`),
    ``checkpoint_format`` a registered format (`check_checkpoint_format`), ``clock`` resolved
    (`resolve_clock`: the front door's, which the managers, a worker's waits and the sharded
    restore's wait read from here instead of taking it beside the record)."""

    basename: str = "model.ckpt"
    max_to_keep: int | None = 5
    keep_checkpoint_every_n_hours: float = 10000.0
    save_mode: str = "async"
    trusted_globals: tuple = ()
    capture: str = "auto"
    lock: str = "auto"
    lease_secs: float | None = None
    restore_step: int | str | None = None
    keep_best: int | None = None
    best_metric: Any = None
    best_mode: str = "min"
    keep_period: int | None = None
    local_dir: str | None = None
    persist_every_steps: int | None = None
    persist_every_secs: float | None = None
    local_max_to_keep: int | None = 2
    persist_grace_secs: float | None = 120.0
    checkpoint_format: str = "torch"
    peer_replicas: bool = False
    clock: Clock = system_clock

    @property
    def sharded(self) -> bool:
        """Whether every rank writes its shards (`SHARDED_FORMAT`), else the chief alone."""
        return self.checkpoint_format == SHARDED_FORMAT

    def after_first_session(self) -> CheckpointOptions:
        """These options without ``restore_step``: it chooses the first session's checkpoint only."""
        return replace(self, restore_step=None)

    def check_sharded(self) -> None:
        """Refuses what sharded checkpoints (``checkpoint_format="dcp"``) do not take yet:
        ``keep_best``/``keep_period`` (`ValueError` naming the fix)."""
        refuse_for_sharded({"keep_best": self.keep_best, "best_metric": self.best_metric,
                            "best_mode": self.best_mode, "keep_period": self.keep_period})


def check_checkpoint_options(*, basename: Any, max_to_keep: Any, keep_checkpoint_every_n_hours: Any,
                             save_mode: Any, trusted_globals: Any = (), capture: Any = "auto",
                             lock: Any = "auto", lease_secs: Any = None, logdir: str | os.PathLike | None = None,
                             restore_step: Any = None, keep_best: Any = None, best_metric: Any = None,
                             best_mode: Any = "min", keep_period: Any = None, local_dir: Any = None,
                             persist_every_steps: Any = None, persist_every_secs: Any = None,
                             local_max_to_keep: Any = 2, persist_grace_secs: Any = 120.0,
                             checkpoint_format: Any = "torch", peer_replicas: Any = False,
                             clock: Any = None) -> CheckpointOptions:
    """Validates the checkpoint arguments the front doors share, at their construction, into a
    `CheckpointOptions` (``logdir``: the checked checkpoint directory or its `Location`, which
    ``lock``/``lease_secs``, ``restore_step`` and ``local_dir`` must suit; the retention ones:
    `supervisor.checkpoint.layout.best.check_retention`; the tier ones:
    `supervisor.checkpoint.tiers.options.check_tiers`). Errors name the argument, the value and the fix."""
    logdir = None if logdir is None else os.fspath(logdir)
    if not isinstance(basename, str) or not basename or os.sep in basename or basename.startswith("."):
        raise ValueError(f"checkpoint_basename must be a plain file name such as 'model.ckpt', got {basename!r}")
    lock, lease_secs = v.check_lock(lock, lease_secs, logdir, object_store=logdir is not None and is_url(logdir))
    check_retention(max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                    keep_best=keep_best, best_metric=best_metric, best_mode=best_mode, keep_period=keep_period,
                    hours_allow_none=False)
    tiers = check_tiers(local_dir=local_dir, persist_every_steps=persist_every_steps,
                        persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep,
                        persist_grace_secs=persist_grace_secs, logdir=logdir)
    checkpoint_format = check_checkpoint_format(checkpoint_format)
    return CheckpointOptions(
        basename=basename, max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        save_mode=v.check_choice("save_mode", save_mode, ("async", "sync")),
        trusted_globals=check_trusted_globals(trusted_globals), capture=check_capture(capture), lock=lock,
        lease_secs=lease_secs, restore_step=check_restore_step(restore_step, logdir, basename), keep_best=keep_best,
        best_metric=best_metric, best_mode=best_mode, keep_period=keep_period, local_dir=tiers["local_dir"],
        persist_every_steps=tiers["persist_every_steps"], persist_every_secs=tiers["persist_every_secs"],
        local_max_to_keep=tiers["local_max_to_keep"], persist_grace_secs=tiers["persist_grace_secs"],
        checkpoint_format=checkpoint_format, peer_replicas=check_peer_replicas(
            peer_replicas, local_dir=tiers["local_dir"], checkpoint_format=checkpoint_format),
        clock=resolve_clock(clock))
