"""The error hierarchy of torch-supervisor (SPEC §11).

Every error the runtime raises on purpose derives from `SupervisorError`, so
``except SupervisorError`` catches them all. Bad arguments are plain `ValueError` /
`TypeError` raised at construction (see `supervisor._validate`); I/O errors name the path
and the step.
"""
from __future__ import annotations

__all__ = [
    "SupervisorError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointCorruptError",
    "CheckpointVanishedError",
    "LogdirInUseError",
    "StopRequestedError",
    "NanLossDuringTrainingError",
    "RecoverableError",
]


class SupervisorError(Exception):
    """Base class of every error torch-supervisor raises on purpose."""


class CheckpointError(SupervisorError):
    """A checkpoint could not be written, read or trusted."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint that was asked for does not exist."""


class CheckpointVanishedError(CheckpointNotFoundError):
    """A checkpoint disappeared while it was being read: retention (or a person) deleted it.

    It is not damage. A reader that gets it moves on: it looks at the index again and reads
    the checkpoint it names now (`find_and_load` and `checkpoints_iterator` do this). Reuse it
    in any reader that must not report a healthy, deleted checkpoint as corrupt.
    """


class CheckpointCorruptError(CheckpointError):
    """Checkpoints exist but none of them verifies; never silently start fresh."""


class LogdirInUseError(SupervisorError):
    """Another live process holds the logdir's ownership lock."""


class StopRequestedError(SupervisorError):
    """A stop (SIGTERM, SIGINT, ``request_stop``) ended a wait before the session could start,
    e.g. a worker waiting for the chief's first checkpoint. Nothing was restored or saved."""


class NanLossDuringTrainingError(SupervisorError):
    """The monitored loss became NaN or infinite."""


class RecoverableError(SupervisorError):
    """Raised from a step or a hook to make `MonitoredSession` re-create the session.

    The session closes, is re-created from the latest checkpoint (``after_create_session``
    runs again, ``begin`` does not) and the same ``run`` is retried from its start, at most
    ``max_recoveries`` times in a row with exponential backoff.
    """
