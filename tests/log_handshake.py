"""A handshake through a log line: `LineSeen` sets an event when a record's message starts with
``prefix`` (e.g. the worker's "waiting for global step" line: it has reached its wait)."""
from __future__ import annotations

import logging
import threading


class LineSeen(logging.Handler):
    """Sets ``event`` at the first INFO-or-above record whose message starts with ``prefix``."""

    def __init__(self, prefix: str, event: threading.Event) -> None:
        super().__init__(logging.INFO)
        self.prefix, self.event = prefix, event

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.prefix):
            self.event.set()
