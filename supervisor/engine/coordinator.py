"""`Coordinator` and `LooperThread`: one stop condition shared by a set of threads (SPEC §3.4).

TensorFlow semantics: any thread may request a stop; the first request that carries an
exception records it and wins over every later one; `join` re-raises that exception before it
complains about threads that outlived the grace period.

Example::

    coord = Coordinator()
    threads = [LooperThread(coord, 5.0, flush_metrics)]
    for t in threads:
        t.start()
    with coord.stop_on_exception():
        while not coord.should_stop():
            train_one_step()
    coord.request_stop()
    coord.join(threads, stop_grace_secs=10)
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from supervisor._validate import check_bool, check_callable, check_number
from supervisor.clock import Clock, resolve_clock

__all__ = ["Coordinator", "LooperThread", "overdue_warning"]

logger = logging.getLogger(__name__)


class Coordinator:
    """Shares one stop condition, and the first exception, between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._exception: BaseException | None = None
        self._joined = False
        self._registered: set[threading.Thread] = set()
        self._requested_by: str | None = None

    def request_stop(self, exc: BaseException | None = None, *, reason: str | None = None) -> None:
        """Asks every thread to stop. Only the first request may carry an exception; a
        `StopIteration` is a clean stop (data exhausted), not an error.

        The first request is logged once, at INFO, with ``reason`` (else the exception); later
        requests are not logged.
        """
        if isinstance(exc, tuple):  # sys.exc_info() style, as TF accepted
            exc = exc[1]
        if isinstance(exc, StopIteration):
            exc = None
        with self._lock:
            if self._joined and exc is not None:
                # Nobody will join again to re-raise it: raise it here rather than lose it.
                raise exc
            if self._stop_event.is_set():
                return
            self._requested_by = threading.current_thread().name
            if exc is not None:
                self._exception = exc
            if reason is not None or exc is not None:
                logger.info("stop requested: %s", reason if reason is not None else f"{type(exc).__name__}: {exc}")
            self._stop_event.set()

    def should_stop(self) -> bool:
        return self._stop_event.is_set()

    def describe_stop(self) -> str:
        """Who asked this coordinator to stop (the requesting thread's name)."""
        return f"the coordinator was asked to stop (by thread {self._requested_by or 'unknown'})"

    def clear_stop(self) -> None:
        """Forgets the stop request and the recorded exception, so the coordinator can be reused."""
        with self._lock:
            self._joined = False
            self._exception = None
            self._registered.clear()
            self._requested_by = None
            self._stop_event.clear()

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        """Blocks until a stop is requested or ``timeout`` seconds pass; returns whether stopped."""
        return self._stop_event.wait(timeout)

    @contextlib.contextmanager
    def stop_on_exception(self) -> Iterator[None]:
        """Turns any exception raised in the block into a stop request that carries it.

        The exception is recorded, not re-raised: `join` re-raises it. `StopIteration` requests
        a clean stop.
        """
        try:
            yield
        except BaseException as exc:  # noqa: BLE001 - the coordinator's job is to carry it
            self.request_stop(exc)

    def register_thread(self, thread: threading.Thread) -> None:
        """Adds ``thread`` to the threads `join` waits for when called without ``threads``."""
        with self._lock:
            self._registered.add(thread)

    def raise_requested_exception(self) -> None:
        """Raises the exception recorded by the first stop request, if any."""
        with self._lock:
            exc = self._exception
        if exc is not None:
            raise exc.with_traceback(exc.__traceback__)

    @property
    def stop_event(self) -> threading.Event:
        """The event set by the first stop request; wait on it (e.g. ``clock.wait(event, t)``)
        instead of sleeping so a stop ends the wait at once. Do not set it directly."""
        return self._stop_event

    @property
    def exception(self) -> BaseException | None:
        """The exception recorded by the first stop request, or None."""
        return self._exception

    @property
    def joined(self) -> bool:
        return self._joined

    def join(
        self,
        threads: Iterable[threading.Thread] | None = None,
        stop_grace_secs: float = 120,
        ignore_live_threads: bool = False,
    ) -> None:
        """Waits for the threads to end once a stop is requested.

        Blocks until every thread has ended or a stop is requested, then gives the threads
        ``stop_grace_secs`` (real time) to end. Re-raises the recorded exception first (a note
        on it, and a WARNING, name the threads still alive); else, raises `RuntimeError` naming
        the threads still alive (logged instead when ``ignore_live_threads``).
        """
        check_number("stop_grace_secs", stop_grace_secs, minimum=0)
        with self._lock:
            threads = set(self._registered) | set(threads or ())
        threads = [t for t in threads if t is not threading.current_thread()]
        while any(t.is_alive() for t in threads) and not self.wait_for_stop(1.0):
            pass
        deadline = time.monotonic() + stop_grace_secs
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stragglers = sorted(t.name for t in threads if t.is_alive())
        with self._lock:
            self._joined = True
            self._registered.clear()
            exc = self._exception
        message = (f"Coordinator stopped with threads still running after the "
                   f"{stop_grace_secs:g} s grace period: {', '.join(stragglers)}")
        if exc is not None:
            if stragglers:
                logger.warning("%s (stopping because of %s: %s)", message, type(exc).__name__, exc)
                if message not in getattr(exc, "__notes__", ()):
                    exc.add_note(message)
            raise exc.with_traceback(exc.__traceback__)
        if stragglers:
            if not ignore_live_threads:
                raise RuntimeError(message)
            logger.info("%s", message)


@contextlib.contextmanager
def overdue_warning(what: str, after_secs: float) -> Iterator[None]:
    """Logs a WARNING naming ``what`` if the block still runs ``after_secs`` after it started.

    For the calls a closing session cannot interrupt (a hook's ``end``/``on_exception``): the
    WARNING says which one hangs; a second SIGTERM/SIGINT interrupts it.
    """
    timer = threading.Timer(after_secs, logger.warning, args=(
        "%s is still running %g s (stop_grace_secs) after it was called while the session closes; "
        "a second SIGTERM or SIGINT interrupts it", what, after_secs))
    timer.name = "supervisor-overdue-warning"
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


class LooperThread(threading.Thread):
    """Calls ``target`` every ``interval_secs`` until the coordinator stops.

    The first call happens at once; later calls follow a fixed-rate schedule (start + k ×
    interval). A call that overruns skips the ticks it missed rather than bursting to catch
    up. ``interval_secs=0`` or None calls ``target`` back to back (TF's semantics). Between calls the thread waits on the stop event (never a bare sleep), so a stop
    request ends it at once. An exception from ``target`` is reported to the coordinator,
    which stops every other thread and re-raises it from `Coordinator.join`.
    """

    def __init__(
        self,
        coord: Coordinator,
        interval_secs: float | None,
        target: Callable[..., Any],
        args: Iterable[Any] = (),
        kwargs: dict | None = None,
        *,
        clock: Clock | None = None,
        name: str | None = None,
        daemon: bool = True,
    ) -> None:
        if not isinstance(coord, Coordinator):
            raise TypeError(f"coord must be a supervisor.Coordinator, got {coord!r}")
        check_number("interval_secs", interval_secs, minimum=0, allow_none=True)
        check_callable("target", target, allow_none=False)
        check_bool("daemon", daemon)
        super().__init__(name=name or f"LooperThread-{getattr(target, '__name__', 'target')}", daemon=daemon)
        self._coord = coord
        self._interval_secs = float(interval_secs or 0.0)
        self._target_fn = target
        self._target_args = tuple(args)
        self._target_kwargs = dict(kwargs or {})
        self._clock = resolve_clock(clock)
        coord.register_thread(self)

    @classmethod
    def loop(cls, coord: Coordinator, interval_secs: float, target: Callable[..., Any],
             args: Iterable[Any] = (), kwargs: dict | None = None, **options: Any) -> LooperThread:
        """Creates and starts a looper thread."""
        thread = cls(coord, interval_secs, target, args, kwargs, **options)
        thread.start()
        return thread

    def run(self) -> None:
        clock, interval = self._clock, self._interval_secs
        with self._coord.stop_on_exception():
            next_tick = clock.monotonic()
            while not self._coord.should_stop():
                self._target_fn(*self._target_args, **self._target_kwargs)
                if interval == 0:
                    continue
                next_tick += interval
                now = clock.monotonic()
                if next_tick < now:  # overran: skip missed ticks, keep the phase
                    next_tick += interval * ((now - next_tick) // interval + 1)
                if clock.wait(self._coord.stop_event, next_tick - now):
                    break
