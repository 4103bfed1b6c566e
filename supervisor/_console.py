"""What a user sees without configuring logging: the package's INFO lines on stderr.

Every message of the runtime goes through `logging` (``supervisor.*`` and ``hooks.*``). An
application that never configured logging would see only WARNINGs (Python's last-resort
handler) and so nothing on a resume, a stop, or training progress. Like Lightning and
Accelerate, a front door therefore gives the package's top loggers one handler of their own at
INFO — only when the application configured none (the root logger has no handler, and neither
the package logger nor its level was set by the application).

Configuring logging silences it: the handler writes nothing once the root logger has a handler
(``logging.basicConfig(...)`` before or after the session starts: no line twice), and a level or
handler the application set on ``supervisor``/``hooks`` is left alone. Routine machinery (each
commit, each deletion) is DEBUG, so what shows is a restore, a stop and why, progress lines,
and anything wrong.
"""
from __future__ import annotations

import logging
import sys

__all__ = ["install_default_handler"]

_PACKAGE_LOGGERS = ("supervisor", "hooks")


class _DefaultHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` while the application has configured no logging."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"))

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401 - the stderr of now (pytest and others swap it)
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass

    def emit(self, record: logging.LogRecord) -> None:
        root = logging.getLogger()
        if root.handlers:  # the application configured logging since: step aside
            _uninstall()
            if record.levelno < root.getEffectiveLevel():  # let through only by the level we had set
                for handler in root.handlers:
                    handler.addFilter(_DropOnce(record, handler))
            return
        super().emit(record)


class _DropOnce(logging.Filter):
    """Drops one record (passed on to the root's handlers after this handler stepped aside) and
    removes itself from the handler."""

    def __init__(self, record: logging.LogRecord, handler: logging.Handler) -> None:
        super().__init__()
        self._record, self._handler = record, handler

    def filter(self, record: logging.LogRecord) -> bool:
        if record is not self._record:
            return True
        self._handler.removeFilter(self)
        return False


def _uninstall() -> None:
    for name in _PACKAGE_LOGGERS:
        package_logger = logging.getLogger(name)
        for handler in [h for h in package_logger.handlers if isinstance(h, _DefaultHandler)]:
            package_logger.removeHandler(handler)
            package_logger.setLevel(logging.NOTSET)  # the level we set: the application's config rules now


def install_default_handler() -> None:
    """Gives ``supervisor`` and ``hooks`` their INFO handler if the application configured no
    logging (see the module). Idempotent; called by the front doors."""
    if logging.getLogger().handlers:
        return
    for name in _PACKAGE_LOGGERS:
        package_logger = logging.getLogger(name)
        if any(isinstance(h, _DefaultHandler) for h in package_logger.handlers):
            continue
        if package_logger.handlers or package_logger.level != logging.NOTSET:
            continue  # the application set this logger up itself
        package_logger.addHandler(_DefaultHandler())
        package_logger.setLevel(logging.INFO)
