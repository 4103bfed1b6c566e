"""The toolkit for hook authors: what the built-in hooks (`hooks`) are written with, public.

Write a hook the way the built-ins are written: check the constructor's arguments with the
``check_*`` functions (a wrong value fails at construction, with a message naming the argument,
the value and the fix), read step outputs with the scalar helpers, accept a directory with the
path checks and write summaries through a `WriterSlot`. ``hooks/`` imports nothing else of
``supervisor`` that is private (a rule test holds it: tests/core/test_toolkit.py).

- Argument checks: `check_int`, `check_number`, `check_bool`, `check_callable`, `check_choice`,
  `check_schedule` (TF's "every N steps or every N seconds" pair), `as_tuple`.
- Step outputs: `scalars_of`, `scalar_or_none`, `describe_value`, `SINGLE_OUTPUT_KEY`.
- Paths: `check_path`, `check_directory`, `check_logdir`, `check_storage`, `is_url`, `local_path`.
- Summaries: `WriterSlot` (the ``summary_writer``/``output_dir``/session-writer order every
  built-in summary hook follows), `check_summary_writer`.

Example::

    from supervisor import Hook, RunArgs
    from supervisor.toolkit import WriterSlot, check_int, scalar_or_none

    class LossEveryNStepsHook(Hook):  # writes the step's loss to TensorBoard every N steps
        def __init__(self, every_n_steps=100, summary_writer=None, output_dir=None):
            self.every_n_steps = check_int("every_n_steps", every_n_steps, minimum=1)
            self._slot = WriterSlot("LossEveryNStepsHook", summary_writer, output_dir)

        def after_create_session(self, session, coord):
            self._slot.after_create_session(session)

        def before_run(self, run_context):
            return RunArgs(fetches="loss")

        def after_run(self, run_context, run_values):
            step, loss = run_context.session.global_step, scalar_or_none(run_values.results)
            if self._slot.writer is not None and loss is not None and step % self.every_n_steps == 0:
                self._slot.writer.add_scalar("loss", loss, step=step)

The name: a toolkit for anyone extending the runtime (hooks first; a sink or a session creator
uses the same checks), one import beside `supervisor.hook`, the protocol itself
(docs/decisions.md).
"""
from __future__ import annotations

import logging
from typing import Any

from supervisor._paths import check_directory, check_logdir, check_storage, is_url, local_path
from supervisor._scalars import describe_value, scalar_or_none, scalars_of
from supervisor._validate import as_tuple, check_bool, check_callable, check_choice, check_int, check_number, check_path
from supervisor.hook import SINGLE_OUTPUT_KEY
from supervisor.summary import SummaryWriterCache

__all__ = [
    "SINGLE_OUTPUT_KEY",
    "WriterSlot",
    "as_tuple",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_directory",
    "check_int",
    "check_logdir",
    "check_number",
    "check_path",
    "check_schedule",
    "check_storage",
    "check_summary_writer",
    "describe_value",
    "is_url",
    "local_path",
    "scalar_or_none",
    "scalars_of",
]

logger = logging.getLogger(__name__)


def check_schedule(owner: str, steps: tuple[str, Any], secs: tuple[str, Any]) -> tuple[int | None, float | None]:
    """Validates a TF-style "every N steps or every N seconds" pair: exactly one must be set.

    Args:
        owner: the hook's name, for the message.
        steps: ``(argument name, value)`` of the step interval (a positive integer or None).
        secs: ``(argument name, value)`` of the time interval (a positive number or None).

    Returns:
        ``(every_steps, every_secs)`` with the unset one None.

    Raises:
        ValueError: both or neither are set (the message says which to drop or set).

    Examples:
        >>> check_schedule("MyHook", ("every_n_steps", 100), ("every_n_secs", None))
        (100, None)
        >>> check_schedule("MyHook", ("every_n_steps", None), ("every_n_secs", None))
        Traceback (most recent call last):
        ValueError: MyHook: exactly one of every_n_steps and every_n_secs must be given, got every_n_steps=None and every_n_secs=None; e.g. every_n_steps=100 or every_n_secs=60
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


def check_summary_writer(name: str, value: Any) -> Any:
    """``value`` if it is None or writes summaries like `supervisor.summary.SummaryWriter` (has
    ``add_scalars``), else `TypeError` naming ``name``.

    Examples:
        >>> from supervisor.testing import InMemorySummaryWriter
        >>> check_summary_writer("summary_writer", None) is None
        True
        >>> check_summary_writer("summary_writer", "runs/x")
        Traceback (most recent call last):
        TypeError: summary_writer must be a supervisor.summary.SummaryWriter (or an object with its add_scalar/add_scalars/add_session_log/flush methods) or None, got 'runs/x'
    """
    if value is not None and not callable(getattr(value, "add_scalars", None)):
        raise TypeError(f"{name} must be a supervisor.summary.SummaryWriter (or an object with its "
                        f"add_scalar/add_scalars/add_session_log/flush methods) or None, got {value!r}")
    return value


class WriterSlot:
    """Where a hook's summaries go, resolved at every ``after_create_session``: the
    ``summary_writer`` argument, else ``SummaryWriterCache.get(output_dir)``, else the
    session's writer (TF's order). A non-chief session writes no events (SPEC §9) unless it
    was handed a writer object; a chief without any writer writes nothing and says so once.

    Args:
        owner: the hook's name, for the log lines.
        summary_writer: a writer object, or None.
        output_dir: a directory whose shared writer to use, or None (checked: not a file).

    Examples:
        >>> from supervisor.testing import InMemorySummaryWriter
        >>> slot = WriterSlot("MyHook", InMemorySummaryWriter(), None)
        >>> slot.after_create_session(session=None)   # in the hook's after_create_session
        >>> slot.writer.add_scalar("loss", 0.5, step=1)
    """

    __slots__ = ("owner", "_given", "_output_dir", "writer", "_told")

    def __init__(self, owner: str, summary_writer: Any, output_dir: str | None) -> None:
        self.owner = owner
        self._given = check_summary_writer("summary_writer", summary_writer)
        self._output_dir = check_directory("output_dir", output_dir)  # a path to an existing file is refused
        self.writer: Any = summary_writer
        self._told = False

    def after_create_session(self, session: Any) -> None:
        """Resolves `writer` for the session just created (None: write nothing)."""
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
