"""The training session `Estimator.train` runs on: TF's hook assembly (SPEC §10.1).

Every training process gets, in order: `NanTensorHook` on ``loss``, `LoggingTensorHook`
(``loss = 0.53, step = 101 (1.234 sec)`` every ``log_step_count_steps``), `StopAtStepHook` from
``steps``/``max_steps``, then the caller's hooks. The chief also gets a `CheckpointSaverHook` on
the `RunConfig`'s schedule carrying the saving listeners, and `MonitoredTrainingSession`'s
step counter and summary hooks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import hooks as builtin

from supervisor.session import MonitoredSession
from supervisor.training_session import MonitoredTrainingSession

if TYPE_CHECKING:
    from supervisor.estimator.estimator import Estimator

__all__ = ["training_session"]


def training_session(estimator: Estimator, steps: int | None, max_steps: int | None,
                     hooks: tuple[Any, ...], listeners: tuple[Any, ...], *,
                     state: Mapping[str, Any] | None = None) -> MonitoredSession:
    """A `MonitoredTrainingSession` on ``estimator.model_dir`` with TF's hooks; ``state`` is the
    extra training state (default ``estimator.state``)."""
    config = estimator.config
    schedule = {"save_secs": config.save_checkpoints_secs, "save_steps": config.save_checkpoints_steps}
    if listeners and not (schedule["save_secs"] or schedule["save_steps"]):
        raise ValueError("There should be a CheckpointSaverHook to use saving_listeners. Please set one of the "
                         "RunConfig.save_checkpoints_steps or RunConfig.save_checkpoints_secs.")
    session_box: list[MonitoredSession] = []
    train_hooks: list[Any] = [builtin.NanTensorHook("loss")]
    if config.log_step_count_steps:
        train_hooks.append(builtin.LoggingTensorHook(
            {"loss": "loss", "step": lambda: session_box[0].global_step},
            every_n_iter=config.log_step_count_steps, clock=estimator.clock))
    if steps is not None or max_steps is not None:
        train_hooks.append(builtin.StopAtStepHook(num_steps=steps, last_step=max_steps))
    chief_hooks = []
    if schedule["save_secs"] or schedule["save_steps"]:
        chief_hooks.append(builtin.CheckpointSaverHook(estimator.model_dir, listeners=listeners,
                                                       clock=estimator.clock, **schedule))
    session = MonitoredTrainingSession(
        estimator.model_dir, estimator.model, estimator.optimizer,
        state=estimator.state if state is None else state,
        is_chief=config.is_chief, hooks=train_hooks + list(hooks), chief_only_hooks=chief_hooks,
        save_checkpoint_secs=None, save_checkpoint_steps=None,
        save_summaries_steps=config.save_summary_steps or None, save_summaries_secs=None,
        log_step_count_steps=config.log_step_count_steps or None, max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours, clock=estimator.clock)
    session_box.append(session)
    return session
