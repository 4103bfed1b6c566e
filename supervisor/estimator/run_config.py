"""`RunConfig`: where an `Estimator` writes and how often (SPEC §10.1), with TF's defaults and rules.

The task type says what ``train_and_evaluate`` does in this process:

- ``None`` — local mode: train, and evaluate after each checkpoint, in this one process;
- ``"chief"`` / ``"worker"`` — train (the chief writes checkpoints and events);
- ``"evaluator"`` — evaluate the trainer's checkpoints as they appear (never in the process group).

It comes from the ``task_type`` argument, else the ``SUPERVISOR_TASK_TYPE`` /
``SUPERVISOR_TASK_ID`` environment variables (TF read ``TF_CONFIG``), else from torch.distributed:
in a process group (or a torchrun environment) of more than one rank, rank 0 is the chief and
rank r the worker ``r - 1`` (TF numbered workers from 0 beside the chief).

Example::

    config = RunConfig("runs/exp", save_checkpoints_steps=500, keep_checkpoint_max=3)
    config.task_type        # None here; "evaluator" under SUPERVISOR_TASK_TYPE=evaluator
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from supervisor import _validate as v
from supervisor import distributed
from supervisor._paths import is_url, local_path, locate_logdir
from supervisor.checkpoint.storage import Location
from supervisor.checkpoint.layout.best import check_retention

__all__ = ["RunConfig", "TaskType", "TASK_TYPE_ENV", "TASK_ID_ENV", "check_keep_max", "resolve_config"]

TASK_TYPE_ENV = "SUPERVISOR_TASK_TYPE"
TASK_ID_ENV = "SUPERVISOR_TASK_ID"


class TaskType:
    """The task types `train_and_evaluate` dispatches on (TF's ``run_config.TaskType``)."""

    CHIEF = "chief"
    WORKER = "worker"
    EVALUATOR = "evaluator"
    ALL = (CHIEF, WORKER, EVALUATOR)


class _UseDefault:
    def __repr__(self) -> str:
        return "<default>"


_USE_DEFAULT: Any = _UseDefault()
_SAVE_CKPT_ERR = ("`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set; "
                  "set one of them to None")


@dataclasses.dataclass(frozen=True, init=False)
class RunConfig:
    """The run's directory, checkpoint and summary schedule, retention and task.

    Args:
        model_dir: the log directory (checkpoints, events, ``eval/``, ``export/``).
        save_checkpoints_secs: checkpoint every this many seconds (default 600 when neither
            is given).
        save_checkpoints_steps: checkpoint every this many steps. Giving both a value is a
            `ValueError`, as in TF; giving one sets the other to None.
        save_summary_steps: write the step outputs as summaries every this many steps (0: off).
        keep_checkpoint_max: how many recent checkpoints retention keeps (None: all). 0 is
            refused, as by every front door's ``max_to_keep``: TF's ``Saver`` read 0 as "keep
            all", which reads as "keep none"; say None.
        keep_checkpoint_every_n_hours: also keep one checkpoint per this many hours.
        keep_best, best_metric, best_mode, keep_period: also keep the ``keep_best`` best checkpoints
            by ``best_metric`` and every ``keep_period``-th step (`Supervisor`'s arguments). In local
            ``train_and_evaluate`` the evaluation's metrics rank the checkpoints it evaluates;
            otherwise (``train``, or a chief beside an evaluator task) the step outputs' do.
        log_step_count_steps: log the loss and write ``global_step/sec`` every this many steps.
        task_type: ``"chief"``, ``"worker"``, ``"evaluator"`` or None (see the module docs).
        task_id: this task's index among its type (default 0).
        lock: how the chief keeps other writers out of ``model_dir`` (SPEC §5.6, §16):
            ``"auto"`` (default: ``"flock"`` on a local path, ``"lease"`` on an object store),
            ``"flock"`` (an OS file lock) or ``"lease"`` (a lease renewed every
            ``lease_secs / 3``; a dead writer's directory is taken over only after it expired).
            On NFS and Lustre ``flock`` may be node-local: use ``lock="lease"`` there.
        lease_secs: the lease's lifetime unrenewed (None: 60 s). A chief that lost its lease
            fails its next save with `LeaseLostError`, before committing anything.
        storage_options: the object-store client's options when ``model_dir`` is a URL
            (``s3://bucket/prefix``, SPEC §16); None: the ``AWS_*`` environment, ``~/.aws``.
            Left out of ``repr`` and equality (they may hold credentials).
    """

    model_dir: str
    save_checkpoints_secs: float | None
    save_checkpoints_steps: int | None
    save_summary_steps: int
    keep_checkpoint_max: int | None
    keep_checkpoint_every_n_hours: float
    log_step_count_steps: int
    task_type: str | None
    task_id: int
    lock: str
    lease_secs: float | None
    keep_best: int | None
    best_metric: Any
    best_mode: str
    keep_period: int | None
    storage_options: dict[str, Any] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __init__(self, model_dir: str | os.PathLike, save_checkpoints_secs: Any = _USE_DEFAULT,
                 save_checkpoints_steps: Any = _USE_DEFAULT, save_summary_steps: int = 100,
                 keep_checkpoint_max: int | None = 5, keep_checkpoint_every_n_hours: float = 10000,
                 log_step_count_steps: int = 100, task_type: str | None = None,
                 task_id: int | None = None, lock: str = "auto", lease_secs: float | None = None,
                 storage_options: dict[str, Any] | None = None, keep_best: int | None = None, best_metric: Any = None,
                 best_mode: str = "min", keep_period: int | None = None) -> None:
        if not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir):
            raise TypeError(f"model_dir must be a non-empty directory path, got {model_dir!r}")
        location = locate_logdir("model_dir", model_dir, allow_none=False, storage_options=storage_options)
        model_dir = location.path  # type: ignore[union-attr]
        secs, steps = _checkpoint_schedule(save_checkpoints_secs, save_checkpoints_steps)
        task_type, task_id = _resolve_task(task_type, task_id)
        lock, lease_secs = v.check_lock(lock, lease_secs, model_dir, object_store=is_url(model_dir))
        keep_checkpoint_max = check_keep_max("keep_checkpoint_max", keep_checkpoint_max)  # 0: all, as TF
        check_retention(max_to_keep=keep_checkpoint_max, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                        keep_best=keep_best, best_metric=best_metric, best_mode=best_mode, keep_period=keep_period)
        fields = {
            "model_dir": os.fspath(model_dir),
            "save_checkpoints_secs": secs,
            "save_checkpoints_steps": steps,
            "save_summary_steps": v.check_int("save_summary_steps", save_summary_steps, minimum=0),
            "keep_checkpoint_max": keep_checkpoint_max,
            "keep_checkpoint_every_n_hours": v.check_number(
                "keep_checkpoint_every_n_hours", keep_checkpoint_every_n_hours, strictly_positive=True),
            "log_step_count_steps": v.check_int("log_step_count_steps", log_step_count_steps, minimum=0),
            "task_type": task_type,
            "task_id": task_id,
            "lock": lock,
            "lease_secs": lease_secs,
            "keep_best": keep_best, "best_metric": best_metric, "best_mode": best_mode, "keep_period": keep_period,
            "storage_options": dict(storage_options) if storage_options else None,  # checked by check_logdir
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_location", location)

    @property
    def location(self) -> Location:
        """``model_dir`` resolved once, with the `Storage` that serves it (the estimator, its
        sessions, evaluations and exporters reuse it: `supervisor.checkpoint.storage.Location`)."""
        return self._location  # type: ignore[attr-defined]

    @property
    def is_chief(self) -> bool:
        """Whether this process trains as the chief (local mode included)."""
        return self.task_type in (None, TaskType.CHIEF)

    @property
    def is_local(self) -> bool:
        """Whether ``train_and_evaluate`` trains and evaluates in this one process."""
        return self.task_type is None

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with some arguments changed (TF's ``RunConfig.replace``)."""
        arguments = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if "save_checkpoints_steps" in changes and "save_checkpoints_secs" not in changes:
            arguments["save_checkpoints_secs"] = _USE_DEFAULT
        if "save_checkpoints_secs" in changes and "save_checkpoints_steps" not in changes:
            arguments["save_checkpoints_steps"] = _USE_DEFAULT
        unknown = sorted(set(changes) - set(arguments))
        if unknown:
            raise ValueError(f"RunConfig.replace: unknown argument(s) {unknown}; known: {sorted(arguments)}")
        arguments.update(changes)
        return RunConfig(**arguments)


def check_keep_max(name: str, value: Any) -> int | None:
    """A retention count: a positive int, or None to keep every checkpoint. 0 is refused with
    the fix (TF's ``Saver`` meant "keep all" by 0; here only None means that)."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        raise ValueError(f"{name}=0 is refused: pass None to keep every checkpoint (TF's Saver meant 'keep all' "
                         "by 0), or a positive number of recent checkpoints to keep")
    return v.check_int(name, value, minimum=1, allow_none=True)


def _checkpoint_schedule(secs: Any, steps: Any) -> tuple[float | None, int | None]:
    """TF's rule: neither given -> 600 s; one given -> the other None; both set -> ValueError."""
    if secs is _USE_DEFAULT and steps is _USE_DEFAULT:
        secs, steps = 600, None
    elif secs is _USE_DEFAULT:
        secs = None
    elif steps is _USE_DEFAULT:
        steps = None
    elif secs is not None and steps is not None:
        raise ValueError(f"{_SAVE_CKPT_ERR} (got save_checkpoints_secs={secs!r}, "
                         f"save_checkpoints_steps={steps!r})")
    secs = v.check_number("save_checkpoints_secs", secs, minimum=0, allow_none=True)
    steps = v.check_int("save_checkpoints_steps", steps, minimum=0, allow_none=True)
    return secs or None, steps or None


def _resolve_task(task_type: Any, task_id: Any) -> tuple[str | None, int]:
    if task_type is None and os.environ.get(TASK_TYPE_ENV):
        task_type = os.environ[TASK_TYPE_ENV]
        if task_id is None and os.environ.get(TASK_ID_ENV):
            task_id = _env_task_id(os.environ[TASK_ID_ENV])
    elif task_type is None and distributed.world_size() > 1:
        rank = distributed.rank()
        task_type = TaskType.CHIEF if rank == 0 else TaskType.WORKER
        task_id = 0 if rank == 0 else rank - 1
    if task_type is not None and task_type not in TaskType.ALL:
        raise ValueError(f"task_type must be one of {', '.join(map(repr, TaskType.ALL))} or None (local), "
                         f"got {task_type!r}; check the argument or ${TASK_TYPE_ENV}")
    task_id = v.check_int("task_id", 0 if task_id is None else task_id, minimum=0)
    return task_type, task_id


def _env_task_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"${TASK_ID_ENV} must be a non-negative integer, got {text!r}") from None


def resolve_config(model_dir: Any, config: Any) -> RunConfig:
    """The `Estimator`'s config: ``config``, or ``RunConfig(model_dir)``; both given must name
    the same directory."""
    if config is not None and not isinstance(config, RunConfig):
        raise TypeError(f"config must be a supervisor.estimator.RunConfig or None, got {config!r}")
    if config is None:
        if model_dir is None:
            raise ValueError("Estimator needs a model_dir: pass model_dir= or config=RunConfig(model_dir)")
        return RunConfig(model_dir)
    if model_dir is not None and _same_dir(os.fspath(model_dir)) != _same_dir(config.model_dir):
        raise ValueError(f"model_dir={os.fspath(model_dir)!r} and config.model_dir={config.model_dir!r} differ; "
                         "pass one of them, or the same directory to both")
    return config


def _same_dir(path: str) -> str:
    """``path`` spelled for comparison: a URL without its trailing ``/``, a local path absolute."""
    return path.rstrip("/") if is_url(path) else os.path.abspath(local_path(path))
