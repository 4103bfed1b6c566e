"""The training session `Estimator.train` runs on: a `MonitoredTrainingSession` with TF's hook
assembly (SPEC §10.1).

Every training process gets, in order: `NanTensorHook` on ``loss``, `LoggingTensorHook`
(``loss = 0.53, step = 101 (1.234 sec)`` every ``log_step_count_steps``), `StopAtStepHook` from
``steps``/``max_steps``, then the caller's hooks. The chief also gets a `CheckpointSaverHook` on
the `RunConfig`'s schedule carrying the saving listeners, and `MonitoredTrainingSession`'s
step counter and summary hooks.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import hooks as builtin

from supervisor.clock import Clock
from supervisor.estimator.run_config import RunConfig
from supervisor.engine.session import MonitoredSession
from supervisor.frontdoors.training_session import MonitoredTrainingSession

__all__ = ["training_session"]


def training_session(config: RunConfig, model: Any, optimizer: Any, state: Mapping[str, Any] | None, *,
                     clock: Clock, steps: int | None, max_steps: int | None, hooks: tuple[Any, ...],
                     listeners: tuple[Any, ...], init_fn: Callable[[Any], Any] | None = None) -> MonitoredSession:
    """A `MonitoredTrainingSession` on ``config.model_dir`` training ``model``/``optimizer``/
    ``state`` with TF's hooks (see the module docstring); ``init_fn`` runs when nothing was
    restored (the warm start)."""
    chief_hooks = _chief_hooks(config, clock, listeners)  # first: it refuses listeners without saves
    session_box: list[MonitoredSession] = []
    session = MonitoredTrainingSession(
        config.location, model, optimizer, state=state, is_chief=config.is_chief,
        hooks=_train_hooks(config, clock, steps, max_steps, session_box) + list(hooks),
        chief_only_hooks=chief_hooks,
        save_checkpoint_secs=None, save_checkpoint_steps=None,
        save_summaries_steps=config.save_summary_steps or None, save_summaries_secs=None,
        log_step_count_steps=config.log_step_count_steps or None, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours, lock=config.lock,
        lease_secs=config.lease_secs, clock=clock, init_fn=init_fn,
        keep_best=config.keep_best, best_metric=config.best_metric, best_mode=config.best_mode,
        keep_period=config.keep_period)
    session_box.append(session)
    return session


def _train_hooks(config: RunConfig, clock: Clock, steps: int | None, max_steps: int | None,
                 session_box: list[MonitoredSession]) -> list[Any]:
    """Every process's hooks; the logging hook reads the step of the session put in ``session_box``."""
    train_hooks: list[Any] = [builtin.NanTensorHook("loss")]
    if config.log_step_count_steps:
        train_hooks.append(builtin.LoggingTensorHook(
            {"loss": "loss", "step": lambda: session_box[0].global_step},
            every_n_iter=config.log_step_count_steps, clock=clock))
    if steps is not None or max_steps is not None:
        train_hooks.append(builtin.StopAtStepHook(num_steps=steps, last_step=max_steps))
    return train_hooks


def _chief_hooks(config: RunConfig, clock: Clock, listeners: tuple[Any, ...]) -> list[Any]:
    """The chief's `CheckpointSaverHook` on the `RunConfig`'s schedule, carrying ``listeners``."""
    schedule = {"save_secs": config.save_checkpoints_secs, "save_steps": config.save_checkpoints_steps}
    if not (schedule["save_secs"] or schedule["save_steps"]):
        if listeners:
            raise ValueError("There should be a CheckpointSaverHook to use saving_listeners. Please set one of "
                             "the RunConfig.save_checkpoints_steps or RunConfig.save_checkpoints_secs.")
        return []
    return [builtin.CheckpointSaverHook(config.location, listeners=listeners, clock=clock, **schedule)]
