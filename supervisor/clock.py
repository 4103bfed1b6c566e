"""Injectable clocks.

Everything in torch-supervisor that depends on time takes ``clock=None`` and uses
`SystemClock` by default, so tests drive time with `supervisor.testing.FakeClock` instead of
sleeping or patching the global `time` module.

A clock has three methods:

- ``time()``: wall-clock seconds since the epoch (for checkpoint timestamps and retention);
- ``monotonic()``: seconds on a monotonic scale (for intervals, rates and timeouts);
- ``wait(event, timeout_secs)``: block until ``event`` is set or the timeout passes; returns
  whether the event is set. Waiting on an event rather than sleeping is what lets a stop
  request end every wait at once.
- ``sleep(secs)``: pause the calling thread (used only for recovery backoff on the training
  thread; a fake clock advances its time instead of blocking).
"""
from __future__ import annotations

import threading
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "system_clock", "resolve_clock"]


@runtime_checkable
class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def wait(self, event: threading.Event, timeout_secs: float | None) -> bool: ...

    def sleep(self, secs: float) -> None: ...


class SystemClock:
    """The real clock: `time.time`, `time.monotonic` and `Event.wait`."""

    time = staticmethod(_time.time)
    monotonic = staticmethod(_time.monotonic)

    @staticmethod
    def wait(event: threading.Event, timeout_secs: float | None) -> bool:
        return event.wait(timeout_secs)

    @staticmethod
    def sleep(secs: float) -> None:
        _time.sleep(secs)

    def __repr__(self) -> str:
        return "SystemClock()"


system_clock = SystemClock()


def resolve_clock(clock: Clock | None, *, argument: str = "clock") -> Clock:
    """Returns ``clock`` or the system clock; rejects objects that are not clocks."""
    if clock is None:
        return system_clock
    missing = [name for name in ("time", "monotonic", "wait", "sleep") if not callable(getattr(clock, name, None))]
    if missing:
        raise TypeError(
            f"{argument} must provide time(), monotonic(), wait(event, timeout_secs) and sleep(secs) "
            f"(e.g. supervisor.testing.FakeClock()), got {clock!r} without {', '.join(missing)}"
        )
    return clock
