"""Scalar sinks: where a session's scalars go besides TensorBoard's events file.

TensorBoard stays the default and the record a resume relies on; a sink receives a copy of
every scalar the session's summary writer writes (step outputs, ``global_step/sec``,
``summary_fn`` values) — pass sinks to a front door::

    from supervisor.sinks import MLflowSink
    with MonitoredTrainingSession(logdir, model=model, optimizer=opt,
                                  summary_sinks=[MLflowSink(experiment_name="lstm")]) as s:
        ...

A sink implements `ScalarSink`: ``write`` is called on the training thread and must only queue
(it runs at every summary step); ``flush`` sends what was queued and is called when the
summary writer flushes — at the writer's periodic flush, before a checkpoint is published, and
at session close; ``close`` flushes and releases it. A sink with ``state_dict()`` /
``load_state_dict()`` is checkpointed with the training state under ``sink.state_name`` as an
optional entry (a checkpoint written without it restores; one written with it restores into a
session without it), which is how `MLflowSink` continues the same MLflow run after a resume.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

__all__ = ["MLflowSink", "ScalarSink"]  # and the front doors' helpers below


class ScalarSink:
    """The interface of a scalar sink (see the module). Subclass it, or provide the same methods."""

    def write(self, step: int, scalars: Mapping[str, float], wall_time: float) -> None:
        """Queues ``scalars`` (``{tag: float}``) at ``step``; called on the training thread."""
        raise NotImplementedError

    def flush(self) -> None:
        """Sends everything queued so far; blocks until it is sent (or failed with a WARNING)."""

    def close(self) -> None:
        """Flushes and releases the sink; closing twice is a no-op."""


def check_sinks(sinks: Any) -> list[Any]:
    """The front doors' ``summary_sinks``: a list of objects with ``write``, ``flush``, ``close``."""
    if sinks is None:
        return []
    if isinstance(sinks, (str, bytes)) or not isinstance(sinks, Iterable):
        raise TypeError(f"summary_sinks must be a list of sinks (e.g. [MLflowSink(...)]), got {sinks!r}")
    sinks = list(sinks)
    for i, sink in enumerate(sinks):
        missing = [m for m in ("write", "flush", "close") if not callable(getattr(sink, m, None))]
        if isinstance(sink, type) or missing:
            raise TypeError(f"summary_sinks[{i}] must be a scalar sink with write(step, scalars, wall_time), flush() "
                            f"and close() (supervisor.sinks.ScalarSink), got {sink!r}"
                            + (" (a class: create an instance)" if isinstance(sink, type) else ""))
    return sinks


def __getattr__(name: str) -> Any:  # MLflowSink imports nothing of mlflow until it is used
    if name == "MLflowSink":
        from supervisor.sinks.mlflow_sink import MLflowSink
        return MLflowSink
    raise AttributeError(f"module 'supervisor.sinks' has no attribute {name!r}")


def with_sink_entries(state: Mapping[str, Any] | None, sinks: list[Any]) -> Mapping[str, Any] | None:
    """``state`` plus each stateful sink under its ``state_name`` (see the module)."""
    stateful = [s for s in sinks if callable(getattr(s, "state_dict", None)) and callable(getattr(s, "load_state_dict", None))]
    if not stateful:
        return state
    merged = dict(state or {})
    for sink in stateful:
        name = getattr(sink, "state_name", None) or type(sink).__name__.lower()
        if name in merged:
            raise ValueError(f"the summary sink {sink!r} keeps its state under the name {name!r}, which state= already "
                             f"uses; rename that entry or pass the sink another state_name=")
        merged[name] = sink
    return merged


def prepare_sinks(summary_sinks: Any, state: Mapping[str, Any] | None, *, is_chief: bool, writes_summaries: Any,
                  logdir: Any = "") -> tuple[list[Any], Mapping[str, Any] | None]:
    """A front door's ``summary_sinks`` checked, and ``state`` with their entries: the chief's
    only (summaries are the chief's; other processes ignore the sinks). No summaries are
    written without a ``logdir`` (None) or when ``writes_summaries`` is falsy."""
    sinks = check_sinks(summary_sinks) if is_chief else []
    check_sinks_have_a_writer(sinks, bool(writes_summaries) and logdir is not None)
    return sinks, with_sink_entries(state, sinks)


def check_sinks_have_a_writer(sinks: list[Any], writes_summaries: bool) -> None:
    """Sinks receive the summary writer's scalars: a session writing no summaries cannot feed them."""
    if sinks and not writes_summaries:
        raise ValueError("summary_sinks were given but this session writes no summaries (no logdir/summary_dir, or "
                         "summaries turned off: save_summaries_secs=0 / save_summaries_steps=None and "
                         "log_step_count_steps=None); turn summaries on or drop summary_sinks")
