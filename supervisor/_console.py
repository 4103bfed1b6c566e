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

Progress (the front doors' ``progress="auto"|True|False``): with ``"auto"`` the chief shows a
tqdm bar (steps, rate, the step's latest scalar outputs such as the loss) instead of the periodic
``step N: ...`` INFO line when stderr is a terminal, ``tqdm`` is importable and the application
configured no logging (the rule above); piped or redirected output keeps the periodic line.
``True`` asks for the bar (tqdm required), ``False`` keeps the line. While a bar is open, the
default handler writes its lines above it (``tqdm.external_write_mode``), never through it.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any

from supervisor._shadowing import import_builtin_hooks

__all__ = ["install_default_handler", "check_progress", "shows_progress_bar", "progress_hooks"]

_PROGRESS_CHOICES = ("auto", True, False)

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
        tqdm = sys.modules.get("tqdm")  # a bar may be open: write above it, not through it
        if tqdm is not None and hasattr(tqdm, "tqdm"):
            with tqdm.tqdm.external_write_mode(file=sys.stderr):
                super().emit(record)
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


def check_progress(progress: Any) -> Any:
    """The front doors' ``progress`` argument: ``"auto"``, True or False (see the module)."""
    if not any(progress is c or (isinstance(c, str) and progress == c) for c in _PROGRESS_CHOICES):
        raise ValueError(f"progress must be 'auto' (a tqdm bar when stderr is a terminal, tqdm is installed and "
                         f"logging is not configured), True (a bar) or False (the periodic step line), got "
                         f"{progress!r}")
    if progress is True and importlib.util.find_spec("tqdm") is None:
        raise ValueError("progress=True shows a tqdm bar, but tqdm is not installed: pip install tqdm (or "
                         "torch-supervisor[progress]), or pass progress='auto' to fall back to log lines")
    return progress


def shows_progress_bar(progress: Any) -> bool:
    """Whether a chief with this ``progress`` setting shows a bar now (see the module)."""
    if progress != "auto":
        return bool(progress)
    isatty = getattr(sys.stderr, "isatty", None)
    return (callable(isatty) and bool(isatty()) and not logging.getLogger().handlers
            and importlib.util.find_spec("tqdm") is not None)


def progress_hooks(progress: Any, *, is_chief: bool) -> list[Any]:
    """The default bar (a `ProgressBarHook` showing the step's outputs, refreshed every second)
    when this process shows one, else nothing."""
    if not (is_chief and shows_progress_bar(progress)):
        return []
    return [import_builtin_hooks().ProgressBarHook(use_tqdm=True, show_outputs=True, every_n_secs=1.0)]
