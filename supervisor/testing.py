"""Test doubles shipped for users testing their own hooks: `FakeClock`, `RecordingHook`,
`InMemorySummaryWriter`.

Example::

    clock = FakeClock()
    recorder = RecordingHook()
    with MonitoredSession(hooks=[MyHook(clock=clock), recorder]) as s:
        s.run(step)
        clock.advance(10)
        s.run(step)
    assert recorder.calls == ["begin", "after_create_session", "before_run", "after_run",
                              "before_run", "after_run", "end"]
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from supervisor.hook import Hook, RunArgs

__all__ = ["FakeClock", "RecordingHook", "InMemorySummaryWriter", "ScalarEvent", "SessionLogEvent"]


class FakeClock:
    """A clock whose time moves only when told to (`advance`, `sleep`).

    ``wait(event, timeout)`` blocks until the event is set or the fake time reaches the
    deadline (another thread calls `advance`), so looper threads tick exactly when a test says.
    ``sleep(secs)`` advances the time at once (the caller is the only one waiting).
    """

    def __init__(self, start_secs: float = 1_000_000.0) -> None:
        self._now = float(start_secs)
        self._cond = threading.Condition()
        self._deadlines: dict[object, float] = {}

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def advance(self, secs: float) -> None:
        if secs < 0:
            raise ValueError(f"secs must be >= 0, got {secs!r}; a clock does not go back")
        with self._cond:
            self._now += secs
            self._cond.notify_all()

    def sleep(self, secs: float) -> None:
        self.advance(max(0.0, secs))

    def wait(self, event: threading.Event, timeout_secs: float | None) -> bool:
        key = object()
        with self._cond:
            deadline = float("inf") if timeout_secs is None else self._now + timeout_secs
            self._deadlines[key] = deadline
            self._cond.notify_all()
            try:
                while not event.is_set() and self._now < deadline:
                    # The event has no hook into our condition: poll it every 5 ms (real time).
                    self._cond.wait(0.005)
            finally:
                del self._deadlines[key]
                self._cond.notify_all()
        return event.is_set()

    def wait_for_waiters(self, count: int = 1, timeout_secs: float = 10.0) -> None:
        """Blocks (real time) until ``count`` threads wait on this clock for a future time.

        After `advance`, a thread whose deadline passed counts again only once it has done its
        work and waits for its next deadline, so this tells a test that looper threads finished
        the ticks the advance caused.
        """
        def settled() -> bool:
            return sum(1 for d in self._deadlines.values() if d > self._now) >= count

        with self._cond:
            if not self._cond.wait_for(settled, timeout_secs):
                raise TimeoutError(f"{count} waiter(s) expected on the fake clock after {timeout_secs} s; "
                                   f"deadlines {sorted(self._deadlines.values())} at now={self._now}")

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now})"


class RecordingHook(Hook):
    """Records every hook call, in order, as ``calls`` (method names) and ``events``
    (method name with the global step when one is known)."""

    def __init__(self, fetches: Any = None, feeds: dict | None = None, name: str = "") -> None:
        self.fetches, self.feeds, self.name = fetches, feeds, name
        self.calls: list[str] = []
        self.events: list[tuple[str, Any]] = []
        self.results: list[Any] = []
        self.exceptions: list[BaseException] = []

    def _record(self, method: str, step: Any = None) -> None:
        self.calls.append(method)
        self.events.append((method, step))

    def begin(self) -> None:
        self._record("begin")

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._record("after_create_session", session.global_step)

    def before_run(self, run_context: Any) -> RunArgs | None:
        self._record("before_run", run_context.session.global_step)
        if self.fetches is None and self.feeds is None:
            return None
        return RunArgs(fetches=self.fetches, feeds=self.feeds)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._record("after_run", run_context.session.global_step)
        self.results.append(run_values.results)

    def end(self, session: Any) -> None:
        self._record("end", session.global_step)

    def on_exception(self, session: Any, exc: BaseException) -> None:
        self._record("on_exception", session.global_step)
        self.exceptions.append(exc)


@dataclass(frozen=True)
class ScalarEvent:
    tag: str
    value: float
    step: int
    walltime: float | None = None


@dataclass(frozen=True)
class SessionLogEvent:
    status: str  # "START", "STOP" or "CHECKPOINT"
    step: int
    checkpoint_path: str | None = None
    msg: str = ""


@dataclass
class InMemorySummaryWriter:
    """A summary writer that keeps what it is given in lists, with the interface of
    `supervisor.summary.SummaryWriter`."""

    logdir: str | None = None
    scalars: list[ScalarEvent] = field(default_factory=list)
    session_logs: list[SessionLogEvent] = field(default_factory=list)
    flushes: int = 0
    closed: bool = False

    def add_scalar(self, tag: str, value: Any, step: int, walltime: float | None = None) -> None:
        self.scalars.append(ScalarEvent(tag, float(value), int(step), walltime))

    def add_scalars(self, values: dict[str, Any], step: int, walltime: float | None = None) -> None:
        for tag, value in values.items():
            self.add_scalar(tag, value, step, walltime)

    def add_session_log(self, status: str, step: int, *, checkpoint_path: str | None = None, msg: str = "") -> None:
        self.session_logs.append(SessionLogEvent(status, int(step), checkpoint_path, msg))

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> InMemorySummaryWriter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def scalar_steps(self, tag: str) -> list[int]:
        return [e.step for e in self.scalars if e.tag == tag]

    def scalar_values(self, tag: str) -> list[float]:
        return [e.value for e in self.scalars if e.tag == tag]
