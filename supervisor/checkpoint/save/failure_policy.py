"""The save-failure policy of SPEC §5.2, as a pure function (`CheckpointManager._failed`
applies it): which error a failed save becomes, and whether training may go on."""
from __future__ import annotations

import logging

from supervisor.checkpoint.ownership.lease import LeaseLostError
from supervisor.errors import CheckpointError

__all__ = ["ConsecutiveFailures", "failure_verdict"]

logger = logging.getLogger(__name__)


def failure_verdict(message: str, error: BaseException, *, in_a_row: int,
                    limit: int | None) -> tuple[CheckpointError, bool]:
    """``(failure, tolerated)`` for the ``in_a_row``-th consecutive failed save.

    ``limit`` is ``max_consecutive_save_failures`` (None: the first failure is fatal). A lost
    lease is never tolerated: every later save would fail too, and another writer owns the logdir.
    """
    if isinstance(error, LeaseLostError):
        failure: CheckpointError = LeaseLostError(f"{message}: {error}")
        limit = None
    else:
        failure = CheckpointError(f"{message}: {type(error).__name__}: {error}")
    failure.__cause__ = error
    if limit is not None and in_a_row < limit:
        return failure, True
    if limit is not None:
        failure = CheckpointError(f"{failure} ({in_a_row} saves in a row failed; "
                                  f"max_consecutive_save_failures={limit})")
        failure.__cause__ = error
    return failure, False


class ConsecutiveFailures:
    """`failure_verdict` over a run of attempts (e.g. the copies of a checkpoint tier): counts
    the failures in a row, ``limit`` as ``max_consecutive_save_failures``."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.in_a_row = limit, 0

    def succeeded(self) -> None:
        self.in_a_row = 0

    def failed(self, message: str, error: BaseException, *, tolerated_note: str) -> CheckpointError | None:
        """The fatal failure, or None when tolerated (a WARNING: ``message``, ``tolerated_note``, the count)."""
        self.in_a_row += 1
        failure, tolerated = failure_verdict(message, error, in_a_row=self.in_a_row, limit=self.limit)
        if not tolerated:
            return failure
        logger.warning("%s; %s (%d of max_consecutive_save_failures=%d failures in a row)", failure, tolerated_note,
                       self.in_a_row, self.limit)
        return None
