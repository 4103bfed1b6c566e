"""`SessionEnvironment`: what a session runs in — its log directory, whether it is the chief,
where summaries go, which checkpoint manager writes (and so owns the logdir's lock).

It is the *where*; the session creator (`supervisor.SessionCreator` and its checkpoint-backed
subclasses) is the *how*: the restore-or-initialise policy of SPEC §4. A front door builds the
environment (opening the summary writer, the checkpoint manager) and hands it to the creator;
the session reads it (``s.logdir``, ``s.is_chief``, ``s.summary_writer``,
``s.checkpoint_manager``) and closes it once, at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from supervisor.summary import SummaryWriter, SummaryWriterCache

__all__ = ["SessionEnvironment"]


@dataclass
class SessionEnvironment:
    """The session's place in the world.

    Attributes:
        logdir: the log directory (read-only on a non-chief), or None.
        is_chief: whether this process writes checkpoints and summaries.
        summary_writer: where summaries go, or None when this session writes none.
        checkpoints: the checkpoint manager that writes (it holds the logdir's ownership lock
            once opened), or None (no checkpoint directory, or not the chief).
        owns_summary_writer: whether closing the environment gives the writer back
            (`supervisor.summary.SummaryWriterCache.release`): the front door acquired it.
        sinks: the scalar sinks (`supervisor.sinks`) the front door added to the summary
            writer; closing the environment removes and closes them.
    """

    logdir: str | None = None
    is_chief: bool = True
    summary_writer: Any = None
    checkpoints: Any = None
    owns_summary_writer: bool = False
    sinks: list[Any] = field(default_factory=list)

    def open_summaries(self) -> None:
        """Creates the summary writer's events file once the session holds the logdir (the
        creator calls it after its restore took the lock or lease): a session refused the logdir
        leaves no file there (`SummaryWriterCache.acquire` defers it)."""
        if isinstance(self.summary_writer, SummaryWriter):
            self.summary_writer.open()

    def close(self, *, failed: bool) -> None:
        """Closes the checkpoint manager (finishing the save in flight, releasing the lock), then
        gives back the summary writer — even when the manager's close raised, so no events are
        lost."""
        try:
            if self.checkpoints is not None:
                self.checkpoints.close(failed=failed)
        finally:
            try:
                for sink in self.sinks:  # flushed and closed after the final checkpoint's commit
                    self.summary_writer.remove_sink(sink)
            finally:
                if self.owns_summary_writer and self.summary_writer is not None:
                    SummaryWriterCache.release(self.summary_writer)
