"""Moved to `supervisor.events` (`supervisor.events.writer`); this path keeps working."""
from __future__ import annotations

from supervisor.events.record import frame
from supervisor.events.writer import EventFile, event_file_name

__all__ = ["EventFile", "event_file_name", "frame"]
