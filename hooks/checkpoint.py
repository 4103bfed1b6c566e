"""`CheckpointSaverHook` and `CheckpointSaverListener` (SPEC §7, §8), on the checkpoint engine.

The hook saves once at session creation (step 0 — skipped when the session was restored from
a checkpoint of that same step, which would only rewrite it), then every ``save_secs`` or
``save_steps``, then at the boundary where the session stops if the step changed since the last
save. The hook only *requests* its saves: the session captures at the step boundary, after every
hook's ``after_run`` of that step (SPEC §3.5), and writes in the background.

Listeners see committed checkpoints without making saves synchronous: ``before_save`` runs at
the capture; ``after_save`` runs on the training thread at the first step boundary after the
writer reports the commit (or at close), so an evaluation triggered there finds the checkpoint
on disk while training never waited for the write.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping

from supervisor.checkpoint import CheckpointManager, check_basename
from supervisor.clock import Clock
from supervisor.hook import Hook, IdleUntil
from supervisor.toolkit import check_logdir, check_path, check_schedule, check_storage, is_url, local_path

from hooks.timer import SecondOrStepTimer

__all__ = ["CheckpointSaverHook", "CheckpointSaverListener"]

logger = logging.getLogger(__name__)


class CheckpointSaverListener:
    """Called around every save of a `CheckpointSaverHook` (TF's interface)."""

    def begin(self) -> None:
        """Once, before the session is created."""

    def before_save(self, session: Any, global_step_value: int) -> None:
        """Before each save, on the training thread."""

    def after_save(self, session: Any, global_step_value: int) -> bool | None:
        """After each save is committed, on the training thread at the next step boundary;
        return True to stop at that boundary (ignored for the save at session creation)."""

    def end(self, session: Any, global_step_value: int) -> None:
        """Once, at the end of a clean session, after the final save."""


class CheckpointSaverHook(Hook):
    """Saves checkpoints every N seconds or steps, at creation and at the end.

    Args:
        checkpoint_dir: where checkpoints go: a local path or an object-store URL
            (``s3://bucket/prefix``). The session's own checkpoint manager is used when it
            writes to this directory; otherwise the hook opens one (taking the directory's
            ownership lock: a lease on an object store) for the session's lifetime.
        save_secs, save_steps: the schedule; exactly one must be given.
        listeners: `CheckpointSaverListener` instances.
        checkpoint_basename: name prefix of the checkpoints the hook's own manager writes.
        clock: injectable clock.
        storage_options: the object-store client's options for the hook's own manager when
            ``checkpoint_dir`` is a URL (None: ``AWS_*``, ``~/.aws``, ``FSSPEC_S3_*``); unused
            when the session's manager writes there. Refused with a local path.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike, save_secs: float | None = None,
                 save_steps: int | None = None, listeners: Iterable[CheckpointSaverListener] = (),
                 checkpoint_basename: str = "model.ckpt", *, clock: Clock | None = None,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self._dir = _directory(checkpoint_dir, storage_options)
        self._storage_options = dict(storage_options) if storage_options else None
        steps, secs = check_schedule("CheckpointSaverHook", ("save_steps", save_steps), ("save_secs", save_secs))
        if isinstance(listeners, CheckpointSaverListener):  # one listener given bare: accept it
            listeners = [listeners]
        listeners = list(listeners or ())
        for i, listener in enumerate(listeners):
            if not isinstance(listener, CheckpointSaverListener):
                raise TypeError(f"listeners[{i}] must be a hooks.CheckpointSaverListener instance, got {listener!r}")
        self._timer = SecondOrStepTimer(every_secs=secs, every_steps=steps, clock=clock)
        self._listeners = listeners
        self._basename = check_basename(checkpoint_basename, argument="checkpoint_basename")
        self._clock = clock
        self._manager: Any = None
        self._own_manager: Any = None
        # Set by a front door that runs the same step schedule on every rank (MonitoredTraining-
        # Session): a step-scheduled save is then captured at its own step on every rank, not
        # one step later through the rank agreement.
        self.schedule_on_every_rank = False

    def begin(self) -> None:
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._manager = self._resolve_manager(session)
        for listener in self._listeners:
            session.add_checkpoint_listener(listener, manager=self._manager)
        step = session.global_step
        if self._manager.last_saved_step != step:
            session.save_checkpoint(manager=self._manager)  # at creation: listeners' stops ignored
        self._timer.update_last_triggered_step(step)
        session.save_at_stop(self._manager)

    def idle_until(self) -> IdleUntil | None:
        """The session skips this hook until its schedule may trigger (`SecondOrStepTimer.idle_until`)."""
        return self._timer.idle_until()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._timer.trigger_if_due(run_context.session.global_step):
            run_context.session.request_save(
                f"{type(self).__name__} schedule", manager=self._manager,
                on_every_rank=self.schedule_on_every_rank and self._timer.every_steps is not None)

    def end(self, session: Any) -> None:
        # The final checkpoint was captured at the stopping boundary (save_at_stop) and its
        # commit delivered to the listeners (after_save) before the end hooks run.
        try:
            self._manager.wait()
            for listener in self._listeners:
                listener.end(session, session.global_step)
        finally:
            self._close_own(failed=False)

    def on_exception(self, session: Any, exc: BaseException) -> None:
        self._close_own(failed=True)

    def _resolve_manager(self, session: Any) -> Any:
        manager = session.checkpoint_manager
        if manager is not None and _same_directory(manager.directory, self._dir):
            return manager
        if self._own_manager is None:
            self._own_manager = CheckpointManager(self._dir, basename=self._basename, clock=self._clock,
                                                  storage_options=self._storage_options)
            self._own_manager.open()
        return self._own_manager

    def _close_own(self, *, failed: bool) -> None:
        if self._own_manager is not None:
            manager, self._own_manager = self._own_manager, None
            manager.close(failed=failed)


def _directory(value: Any, storage_options: Mapping[str, Any] | None) -> str:
    """A URL as the checkpoint manager spells it (no trailing ``/``; its scheme and client
    checked, unless ``value`` is a location a front door resolved already), a local path made
    absolute (``storage_options`` refused for it)."""
    path = check_path("checkpoint_dir", value)
    if is_url(path):
        return check_logdir("checkpoint_dir", value, storage_options=storage_options)  # type: ignore[return-value]
    check_storage("checkpoint_dir", path, storage_options)
    return os.path.abspath(local_path(path))


def _same_directory(directory: str, other: str) -> bool:
    """Whether a manager's ``directory`` is the hook's (a URL compared as spelled, less a
    trailing ``/``; a local path made absolute)."""
    if is_url(directory):
        return directory.rstrip("/") == other
    return os.path.abspath(directory) == other


class SaveScheduleOnWorker(Hook):
    """A non-chief rank's side of the chief's step-scheduled saves (state.pt format): asks for
    the same saves at the same steps so the agreement applies them at once on every rank (the
    chief writes; this rank takes part in the save's RNG gather). Private to the front doors."""

    def __init__(self, save_steps: int) -> None:
        self._timer = SecondOrStepTimer(every_steps=save_steps)

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._timer.update_last_triggered_step(session.global_step)

    def idle_until(self) -> IdleUntil | None:
        return self._timer.idle_until()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._timer.trigger_if_due(run_context.session.global_step):
            run_context.session.request_save("the chief's CheckpointSaverHook schedule", on_every_rank=True)
