"""Where a background save's failure goes, for both checkpoint managers (SPEC §5.2).

A save nobody waits for fails on the writer thread: the failure goes to the manager's
``on_error`` (the session wires it to a stop request) and, if nothing took it, is raised by the
manager's next call on the training thread. A mixin over the manager's ``_mutex``,
``on_error``, ``_failure`` and ``_failure_delivered``.
"""
from __future__ import annotations

import logging
from typing import Any

from supervisor.errors import CheckpointError

logger = logging.getLogger(__name__)


class FailureDelivery:
    _mutex: Any
    on_error: Any
    _failure: CheckpointError | None
    _failure_delivered: bool

    def _deliver_failure(self, failure: CheckpointError) -> None:
        """Hands ``failure`` to ``on_error``; keeps the first one for `_raise_undelivered`."""
        delivered = False
        if self.on_error is not None:
            try:
                self.on_error(failure)
                delivered = True
            except BaseException as e:  # noqa: BLE001 - e.g. the session is past its last join
                logger.debug("on_error did not take the checkpoint failure (%s); raising it later", e)
        with self._mutex:
            if self._failure is None:
                self._failure, self._failure_delivered = failure, delivered

    def _raise_undelivered(self) -> None:
        with self._mutex:
            if self._failure is None or self._failure_delivered:
                return
            failure, self._failure = self._failure, None
        raise failure
