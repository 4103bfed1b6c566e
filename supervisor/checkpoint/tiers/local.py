"""The local tier of `supervisor.checkpoint.tiers.manager.TieredCheckpointManager` (SPEC §17):
a `CheckpointManager` of the node-local directory whose retention keeps what a copy to the logdir
still needs, and runs once more at close, after the final copies (``before_release``)."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from supervisor.checkpoint.layout.best import MetricKeeper
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.save.overlap import Copier
from supervisor.checkpoint.storage.fileio import Opener
from supervisor.clock import Clock
from supervisor.errors import CheckpointError

__all__ = ["LocalTier"]


class LocalTier(CheckpointManager):
    """The local tier's manager: a `CheckpointManager` whose retention keeps what ``held()`` names
    (its newest ``max_to_keep`` otherwise); ``best_metric``: the metric each save records for the
    logdir (`metric_of`), which ranks checkpoints there, never here. Every other argument is
    `CheckpointManager`'s (the local tier's saves and restores)."""

    def __init__(self, directory: str, *, held: Callable[[], Any], best_metric: Any = None,
                 basename: str = "model.ckpt", max_to_keep: int | None = 5, save_mode: str = "async",
                 verify: str = "full", max_consecutive_save_failures: int | None = None,
                 trusted_globals: Iterable[Any] = (), checkpoint_format: str = "torch", save_rng: bool = True,
                 clock: Clock | None = None, on_error: Callable[[CheckpointError], Any] | None = None,
                 opener: Opener | None = None, capture: str = "auto", copier: Copier | None = None) -> None:
        super().__init__(directory, keep_checkpoint_every_n_hours=None, lock="auto", basename=basename,
                         max_to_keep=max_to_keep, save_mode=save_mode, verify=verify,
                         max_consecutive_save_failures=max_consecutive_save_failures, trusted_globals=trusted_globals,
                         checkpoint_format=checkpoint_format, save_rng=save_rng, clock=clock, on_error=on_error,
                         opener=opener, capture=capture, copier=copier)
        self._publisher.hold = held
        self._metrics = MetricKeeper(best_metric)
        self._published: dict[str, float | None] = {}
        #: At close, once the save in flight committed and before the lock is released: returns
        #: the names still held (not persisted); retention then runs once more without the rest.
        self.before_release: Callable[[], Any] | None = None

    def _release_lock(self) -> None:
        try:
            if self.before_release is not None:
                left = set(self.before_release())
                self._publisher.hold = lambda: left
                self._publisher.retain_again()
        finally:
            super()._release_lock()

    def publish(self, name: str, timestamp: float) -> None:
        metric = self._metrics.pop(name)
        self._published[name] = metric  # the writer thread: `metric_of` takes it at the commit
        self._publisher.publish(name, timestamp, metric)

    def metric_of(self, name: str) -> float | None:
        """The metric the save of ``name`` recorded (once, at its commit)."""
        return self._published.pop(name, None)

    def mark_restored(self, step: int) -> None:
        """A restore from another tier: the session continues from ``step``."""
        self._last_saved_step = self._last_committed_step = step
