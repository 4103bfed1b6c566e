"""Helpers shared by the built-in hooks: argument pairs and the summary-writer slot."""
from __future__ import annotations

import logging
from typing import Any

from supervisor._paths import check_directory
from supervisor._validate import check_int, check_number
from supervisor.summary import SummaryWriterCache

logger = logging.getLogger(__name__)


def check_schedule(owner: str, steps: tuple[str, Any], secs: tuple[str, Any]) -> tuple[int | None, float | None]:
    """Validates a TF-style "every N steps or every N seconds" pair: exactly one must be set.

    Returns ``(every_steps, every_secs)`` with the unset one None.
    """
    (steps_name, every_steps), (secs_name, every_secs) = steps, secs
    if (every_steps is None) == (every_secs is None):
        both = every_steps is not None
        fix = (f"set {steps_name}=None to schedule by seconds, or {secs_name}=None to schedule by steps"
               if both else f"e.g. {steps_name}=100 or {secs_name}=60")
        raise ValueError(f"{owner}: exactly one of {steps_name} and {secs_name} must be given, got "
                         f"{steps_name}={every_steps!r} and {secs_name}={every_secs!r}; {fix}")
    return (check_int(steps_name, every_steps, minimum=1, allow_none=True),
            check_number(secs_name, every_secs, strictly_positive=True, allow_none=True))


def check_output_dir(name: str, value: Any) -> str | None:
    return check_directory(name, value)  # a path to an existing file is refused here


def check_summary_writer(name: str, value: Any) -> Any:
    if value is not None and not callable(getattr(value, "add_scalars", None)):
        raise TypeError(f"{name} must be a supervisor.summary.SummaryWriter (or an object with its "
                        f"add_scalar/add_scalars/add_session_log/flush methods) or None, got {value!r}")
    return value


class WriterSlot:
    """Where a hook's summaries go, resolved at every ``after_create_session``: the
    ``summary_writer`` argument, else ``SummaryWriterCache.get(output_dir)``, else the
    session's writer (TF's order). A non-chief session writes no events (SPEC §9) unless it
    was handed a writer object; a chief without any writer writes nothing and says so once."""

    __slots__ = ("owner", "_given", "_output_dir", "writer", "_told")

    def __init__(self, owner: str, summary_writer: Any, output_dir: str | None) -> None:
        self.owner = owner
        self._given = check_summary_writer("summary_writer", summary_writer)
        self._output_dir = check_output_dir("output_dir", output_dir)
        self.writer: Any = summary_writer
        self._told = False

    def after_create_session(self, session: Any) -> None:
        if self._given is not None:
            self.writer = self._given
        elif not getattr(session, "is_chief", True):
            self.writer = None
            self._tell_once(logging.INFO, "%s writes no summaries: this process is not the chief")
        elif self._output_dir is not None:
            self.writer = SummaryWriterCache.get(self._output_dir)
        else:
            self.writer = getattr(session, "summary_writer", None)
            if self.writer is None:
                self._tell_once(logging.WARNING, "%s writes no summaries: it was given no summary_writer or "
                                "output_dir and the session has no summary writer")

    def _tell_once(self, level: int, message: str) -> None:
        if not self._told:
            self._told = True
            logger.log(level, message, self.owner)
