"""The save-failure policy of SPEC §5.2, as a pure function (`CheckpointManager._failed`
applies it): which error a failed save becomes, and whether training may go on."""
from __future__ import annotations

from supervisor.checkpoint.ownership.lease import LeaseLostError
from supervisor.errors import CheckpointError

__all__ = ["failure_verdict"]


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
