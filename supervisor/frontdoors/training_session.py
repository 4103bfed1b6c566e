"""`MonitoredTrainingSession` and `SingularMonitoredSession`: front door 2, step hooks (SPEC §7).

Example::

    with MonitoredTrainingSession("runs/exp", model=model, optimizer=opt,
                                  save_checkpoint_steps=500,
                                  hooks=[StopAtStepHook(last_step=10_000)]) as s:
        while not s.should_stop():
            s.run(train_step, next(batches))

The chief's hooks are, in order: ``chief_only_hooks``, `StepCounterHook`, `SummarySaverHook`,
`CheckpointSaverHook`, then ``hooks``. Workers get only ``hooks``, never restore on their own
(they wait for the chief's checkpoint) and never write.

TensorFlow's rule for the intervals: leave both ``save_checkpoint_secs`` and
``save_checkpoint_steps`` alone to get the default (600 s); give one to choose it; giving both a
value is a `ValueError`. Same for the summary pair (default: every 100 steps). 0 or None
disables the service.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Mapping

from supervisor import _validate as v
from supervisor.clock import Clock, resolve_clock
from supervisor import distributed
from supervisor.distributed import default_is_chief
from supervisor.errors import RecoverableError
from supervisor.creators.base import check_session_fns
from supervisor.engine.session import MonitoredSession, check_exception_types
from supervisor.sinks import prepare_sinks
from supervisor.state import TrainingState
from supervisor._console import check_progress, progress_hooks
from supervisor._paths import is_url, local_path, locate_logdir
from supervisor.checkpoint.storage import Location
from supervisor._shadowing import import_builtin_hooks
from supervisor.frontdoors.checkpoint_arguments import SHARDED_FORMAT, CheckpointOptions, check_checkpoint_options
from supervisor.frontdoors.supervisor import make_session_creator

__all__ = ["MonitoredTrainingSession", "SingularMonitoredSession"]


class _Default:
    """Marks an argument left at its default (TF's ``USE_DEFAULT``)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


_CKPT_SECS, _CKPT_STEPS = _Default(600), _Default(None)
_SUMMARY_STEPS, _SUMMARY_SECS = _Default(100), _Default(None)


def _interval_pair(service: str, secs: Any, steps: Any) -> tuple[float | None, int | None]:
    """Resolves a (secs, steps) pair with TF's defaults rule and validates it."""
    secs_given, steps_given = not isinstance(secs, _Default), not isinstance(steps, _Default)
    if secs_given and steps_given and secs and steps:
        raise ValueError(f"give either save_{service}_secs or save_{service}_steps, not both "
                         f"(got {secs!r} and {steps!r}); set the other to None")
    if secs_given or steps_given:
        secs = secs if secs_given else None
        steps = steps if steps_given else None
    else:
        secs, steps = secs.value, steps.value
    secs = v.check_number(f"save_{service}_secs", secs, minimum=0, allow_none=True)
    steps = v.check_int(f"save_{service}_steps", steps, minimum=0, allow_none=True)
    return secs or None, steps or None


def _build(
    checkpoint_dir: Location | None, summary_dir: Location | None, options: CheckpointOptions, *, model: Any,
    optimizer: Any, state: Mapping[str, Any] | None, is_chief: bool, hooks: Iterable[Any],
    chief_only_hooks: Iterable[Any], save_checkpoint_secs: Any, save_checkpoint_steps: Any, save_summaries_steps: Any,
    save_summaries_secs: Any, log_step_count_steps: int | None, max_wait_secs: float, init_fn: Any,
    local_init_fn: Any, ready_fn: Any, summary_sinks: Iterable[Any],
    progress: Any) -> tuple[Any, list[Any]]:
    """Validates the other front-door arguments; returns the session creator and the hook list.
    The directories come resolved (`_locations`), the checkpoint options checked (`_options`)."""
    user_hooks = v.check_hooks("hooks", hooks)
    chief_hooks = progress_hooks(check_progress(progress), is_chief=is_chief) + v.check_hooks("chief_only_hooks", chief_only_hooks)
    ckpt_secs, ckpt_steps = _interval_pair("checkpoint", save_checkpoint_secs, save_checkpoint_steps)
    summary_secs, summary_steps = _interval_pair("summaries", save_summaries_secs, save_summaries_steps)
    log_steps = v.check_int("log_step_count_steps", log_step_count_steps, minimum=0, allow_none=True)
    max_wait_secs = v.check_number("max_wait_secs", max_wait_secs, minimum=0, allow_inf=True)
    init_fns = check_session_fns(init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn)
    writes_summaries = bool(is_chief and summary_dir is not None and (log_steps or summary_secs or summary_steps))
    sinks, state = prepare_sinks(summary_sinks, state, is_chief=is_chief, writes_summaries=writes_summaries)
    training_state = TrainingState.from_arguments(model=model, optimizer=optimizer, state=state)
    creator = make_session_creator(
        training_state, checkpoint_dir, is_chief=is_chief, checkpoint_options=options,
        summary_dir=summary_dir if writes_summaries else None, max_wait_secs=max_wait_secs,
        recovery_wait_secs=30, summary_sinks=sinks, **init_fns)
    return creator, _default_hooks(
        creator, options, is_chief=is_chief, checkpoint_dir=checkpoint_dir,
        ckpt_secs=ckpt_secs, ckpt_steps=ckpt_steps, writes_summaries=writes_summaries, log_steps=log_steps,
        summary_secs=summary_secs, summary_steps=summary_steps, chief_hooks=chief_hooks,
        user_hooks=user_hooks)


def _locations(checkpoint_dir: Any, summary_dir: Any, storage_options: Any,
               *, writable: bool) -> tuple[Location | None, Location | None]:
    """The `Location` of each directory, resolved once (the summary directory is the
    checkpoint directory's location when it is None or the same path). ``storage_options``
    configure the client of whichever directory is a URL (both, when both are); given with two
    local directories they are a `ValueError` naming ``checkpoint_dir`` (`check_location`)."""
    urls = {name for name, d in (("checkpoint_dir", checkpoint_dir), ("summary_dir", summary_dir))
            if isinstance(d, (str, os.PathLike)) and is_url(local_path(d))}
    def options(name: str) -> Any:
        return storage_options if name in urls or not urls and name == "checkpoint_dir" else None
    checkpoint = locate_logdir("checkpoint_dir", checkpoint_dir, writable=writable,
                               storage_options=options("checkpoint_dir"))
    same = checkpoint is not None and isinstance(summary_dir, (str, os.PathLike)) and os.fspath(summary_dir) == checkpoint.path
    if summary_dir is None or same:
        return checkpoint, checkpoint
    return checkpoint, locate_logdir("summary_dir", summary_dir, writable=writable, storage_options=options("summary_dir"))


def _default_hooks(creator: Any, options: CheckpointOptions, *, is_chief: bool, checkpoint_dir: str | None,
                   ckpt_secs: float | None, ckpt_steps: int | None, writes_summaries: bool, log_steps: int | None,
                   summary_secs: float | None, summary_steps: int | None, chief_hooks: list[Any],
                   user_hooks: list[Any]) -> list[Any]:
    """The hook list: the built-in hooks the schedules ask for, then the user's (on the options' clock)."""
    clock = options.clock
    saves = checkpoint_dir is not None and bool(ckpt_secs or ckpt_steps)
    if not is_chief and options.sharded and saves:
        # Sharded saves are collectives: every rank runs the checkpoint schedule (§12).
        saver = import_builtin_hooks().CheckpointSaverHook(checkpoint_dir, save_secs=ckpt_secs,
                                                           save_steps=ckpt_steps, clock=clock)
        saver.schedule_on_every_rank = True
        return [saver] + user_hooks
    if not is_chief and distributed.is_distributed() and checkpoint_dir is not None and ckpt_steps:
        return [import_builtin_hooks().SaveScheduleOnWorker(ckpt_steps)] + user_hooks
    if not is_chief or not (writes_summaries or saves):
        return user_hooks if not is_chief else chief_hooks + user_hooks
    builtin = import_builtin_hooks()  # lazily (supervisor never imports hooks at import time), checked
    all_hooks = list(chief_hooks)
    if writes_summaries and log_steps:
        all_hooks.append(builtin.StepCounterHook(every_n_steps=log_steps, summary_writer=creator.summary_writer, clock=clock,
                                                 log_progress=not _shows_bar(builtin, chief_hooks + user_hooks)))
    if writes_summaries and (summary_secs or summary_steps):
        all_hooks.append(builtin.SummarySaverHook(save_steps=summary_steps, save_secs=summary_secs,
                                                  summary_writer=creator.summary_writer, clock=clock))
    if saves:
        saver = builtin.CheckpointSaverHook(checkpoint_dir, save_secs=ckpt_secs, save_steps=ckpt_steps, clock=clock)
        # Every rank of a distributed job runs this step schedule (workers: SaveScheduleOnWorker).
        saver.schedule_on_every_rank = distributed.is_distributed()
        all_hooks.append(saver)
    return all_hooks + user_hooks


def _shows_bar(builtin: Any, hooks: list[Any]) -> bool:
    """A `ProgressBarHook` drawing a bar replaces the step counter's periodic line."""
    return any(isinstance(h, builtin.ProgressBarHook) and h.uses_tqdm for h in hooks)


def MonitoredTrainingSession(  # noqa: N802 - TF's name for the factory
    checkpoint_dir: str | os.PathLike | None = None, model: Any = None, optimizer: Any = None, *,
    state: Mapping[str, Any] | None = None, is_chief: bool | None = None, hooks: Iterable[Any] = (),
    chief_only_hooks: Iterable[Any] = (), save_checkpoint_secs: Any = _CKPT_SECS, save_checkpoint_steps: Any = _CKPT_STEPS,
    save_summaries_steps: Any = _SUMMARY_STEPS, save_summaries_secs: Any = _SUMMARY_SECS,
    log_step_count_steps: int | None = 100, summary_dir: str | os.PathLike | None = None,
    max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float = 10000.0, stop_grace_secs: float = 120,
    max_wait_secs: float = 7200, init_fn: Callable[[Any], Any] | None = None, local_init_fn: Callable[[Any], Any] |
    None = None, ready_fn: Callable[[Any], Any] | None = None, recoverable_exceptions: Any = (RecoverableError,),
    max_recoveries: int = 10, save_mode: str = "async", handle_signals: bool = True, trusted_globals: Iterable[Any] = (),
    clock: Clock | None = None, checkpoint_format: str = "torch", capture: str = "auto", restore_step: Any = None,
    lock: str = "auto", lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None,
    summary_sinks: Iterable[Any] = (), progress: Any = "auto", keep_best: int | None = None, best_metric: Any = None,
    best_mode: str = "min", keep_period: int | None = None, local_dir: str | os.PathLike | None = None,
    persist_every_steps: int | None = None, persist_every_secs: float | None = None, local_max_to_keep: int | None = 2,
    persist_grace_secs: float | None = 120.0, peer_replicas: bool = False) -> MonitoredSession:
    """A `MonitoredSession` with TF's default chief hooks, restore-or-init from ``checkpoint_dir``,
    recovery from ``recoverable_exceptions`` and signal handling. ``checkpoint_format``: ``"torch"`` (one
    ``state.pt``, written by the chief), ``"dcp"`` (DCP shards from every rank, sealed by the chief; SPEC §12)
    or another registered format the chief writes (``"safetensors"``; `supervisor.checkpoint.layout.format_registry`).
    ``max_wait_secs``: how long a non-chief waits for the chief's restore decision. ``capture``:
    ``"overlapped"`` (parameters and optimizer state copied while the next step runs; each
    optimizer's step waits for the copy), ``"blocking"``, or ``"auto"`` (default: blocking;
    overlapped stays opt-in until its CUDA path has run on a GPU); SPEC §5.9. ``lock`` /
    ``lease_secs``: the chief's single-writer lock (``"auto"``: flock locally, a lease on an object
    store; ``"flock"``; ``"lease"``: the safe choice on NFS/Lustre; SPEC §5.6, §16).
    ``storage_options``: the client options of URL directories (``s3://...``; None: ``AWS_*``);
    workers too. ``restore_step``: a step (or one of its checkpoint paths) restored, verified,
    instead of the newest at the first creation only. ``summary_sinks``: the chief's scalars
    also go there, e.g. ``[MLflowSink()]`` (`supervisor.sinks`). ``progress``: a tqdm bar on the chief
    instead of the periodic step line: ``"auto"`` (stderr a terminal, tqdm, no logging configured), True, False.
    ``keep_best``/``best_metric``/``best_mode``/``keep_period``: as `Supervisor`. ``local_dir``: checkpoint tiers
    (SPEC §17): saves go to this node-local directory, and one every ``persist_every_steps`` steps or
    ``persist_every_secs`` seconds (default 600 s) is copied to ``checkpoint_dir`` in the background; the local tier
    keeps ``local_max_to_keep``; closing waits ``persist_grace_secs`` for the final copy (`TieredCheckpointManager`).
    ``peer_replicas``: with ``checkpoint_format="dcp"`` and a ``local_dir``, each rank also keeps a replica of the
    parts of the rank ``LOCAL_WORLD_SIZE`` ranks before it (another node), so one lost node still resumes from the
    local tiers (`supervisor.checkpoint.tiers.peers`; default False; one node: a WARNING, none kept)."""
    clock = resolve_clock(clock)
    chief = default_is_chief(None if is_chief is None else v.check_bool("is_chief", is_chief))
    check_exception_types(recoverable_exceptions)  # these before _build opens the summary writer
    v.check_number("stop_grace_secs", stop_grace_secs, minimum=0)
    v.check_int("max_recoveries", max_recoveries, minimum=0)
    v.check_bool("handle_signals", handle_signals)
    checkpoint, summary = _locations(checkpoint_dir, summary_dir, storage_options, writable=chief)  # resolved once
    options = check_checkpoint_options(
        basename="model.ckpt", max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        save_mode=save_mode, trusted_globals=trusted_globals, capture=capture, lock=lock, lease_secs=lease_secs,
        logdir=checkpoint, restore_step=restore_step, keep_best=keep_best, best_metric=best_metric, best_mode=best_mode,
        keep_period=keep_period, local_dir=local_dir, persist_every_steps=persist_every_steps,
        persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep, persist_grace_secs=persist_grace_secs,
        checkpoint_format=checkpoint_format, peer_replicas=peer_replicas,
        clock=clock)
    creator, all_hooks = _build(
        checkpoint, summary, options, model=model, optimizer=optimizer, state=state, is_chief=chief, hooks=hooks,
        chief_only_hooks=chief_only_hooks, save_checkpoint_secs=save_checkpoint_secs,
        save_checkpoint_steps=save_checkpoint_steps, save_summaries_steps=save_summaries_steps,
        save_summaries_secs=save_summaries_secs, log_step_count_steps=log_step_count_steps, max_wait_secs=max_wait_secs,
        init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
        summary_sinks=summary_sinks, progress=progress)
    return MonitoredSession(creator, all_hooks, stop_grace_secs=stop_grace_secs,
                            recoverable_exceptions=recoverable_exceptions, max_recoveries=max_recoveries,
                            handle_signals=handle_signals, clock=clock)


class SingularMonitoredSession(MonitoredSession):
    """`MonitoredTrainingSession` for the chief alone, without recovery, exposing the raw state.

    Takes `MonitoredTrainingSession`'s arguments less ``is_chief`` and the recovery ones; or an
    explicit ``session_creator`` (then the chief hooks are not added: pass the hooks you want).
    ``checkpoint_format="dcp"``, ``max_wait_secs``, ``capture``, ``lock``, ``lease_secs``,
    ``storage_options``, ``progress`` and the retention arguments and the checkpoint tiers
    (``local_dir``..., ``peer_replicas``) as `MonitoredTrainingSession` (a sharded job's non-chief ranks still run
    a session each: they write their shards).
    """

    _recovery_enabled = False

    def __init__(
        self, checkpoint_dir: str | os.PathLike | None = None, model: Any = None, optimizer: Any = None, *,
        state: Mapping[str, Any] | None = None, hooks: Iterable[Any] = (), chief_only_hooks: Iterable[Any] = (),
        save_checkpoint_secs: Any = _CKPT_SECS, save_checkpoint_steps: Any = _CKPT_STEPS,
        save_summaries_steps: Any = _SUMMARY_STEPS, save_summaries_secs: Any = _SUMMARY_SECS,
        log_step_count_steps: int | None = 100, summary_dir: str | os.PathLike | None = None,
        max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float = 10000.0, stop_grace_secs: float = 120,
        init_fn: Callable[[Any], Any] | None = None, local_init_fn: Callable[[Any], Any] | None = None,
        ready_fn: Callable[[Any], Any] | None = None, save_mode: str = "async", handle_signals: bool = True,
        session_creator: Any = None, trusted_globals: Iterable[Any] = (), clock: Clock | None = None,
        checkpoint_format: str = "torch", max_wait_secs: float = 7200, capture: str = "auto",
        lock: str = "auto", lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None,
        summary_sinks: Iterable[Any] = (), restore_step: int | str | os.PathLike | None = None, progress: Any = "auto",
        keep_best: int | None = None, best_metric: Any = None, best_mode: str = "min", keep_period: int | None = None,
        local_dir: str | os.PathLike | None = None, persist_every_steps: int | None = None,
        persist_every_secs: float | None = None, local_max_to_keep: int | None = 2, persist_grace_secs: float | None = 120.0,
        peer_replicas: bool = False,
    ) -> None:
        clock = resolve_clock(clock)
        v.check_number("stop_grace_secs", stop_grace_secs, minimum=0)  # before _build opens the writer
        v.check_bool("handle_signals", handle_signals)
        if session_creator is not None:
            creator, all_hooks = session_creator, v.check_hooks("hooks", hooks)
        else:
            # The chief alone, except that sharded checkpoints need every rank (§12).
            chief = True if checkpoint_format != SHARDED_FORMAT else default_is_chief(None)
            checkpoint, summary = _locations(checkpoint_dir, summary_dir, storage_options, writable=chief)
            options = check_checkpoint_options(
                basename="model.ckpt", max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                save_mode=save_mode, trusted_globals=trusted_globals, capture=capture, lock=lock, lease_secs=lease_secs,
                logdir=checkpoint, restore_step=restore_step, keep_best=keep_best, best_metric=best_metric,
                best_mode=best_mode, keep_period=keep_period, local_dir=local_dir, persist_every_steps=persist_every_steps,
                persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep,
                persist_grace_secs=persist_grace_secs, checkpoint_format=checkpoint_format, peer_replicas=peer_replicas,
                clock=clock)
            creator, all_hooks = _build(
                checkpoint, summary, options, model=model, optimizer=optimizer, state=state, is_chief=chief, hooks=hooks,
                chief_only_hooks=chief_only_hooks, save_checkpoint_secs=save_checkpoint_secs,
                save_checkpoint_steps=save_checkpoint_steps, save_summaries_steps=save_summaries_steps,
                save_summaries_secs=save_summaries_secs, log_step_count_steps=log_step_count_steps,
                max_wait_secs=max_wait_secs, init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
                summary_sinks=summary_sinks, progress=progress)
        super().__init__(creator, all_hooks, stop_grace_secs=stop_grace_secs,
                         handle_signals=handle_signals, clock=clock)

    def raw_state(self) -> dict[str, Any]:
        """The training state's objects as a plain, mutable dict."""
        return self.training_state.as_dict()
