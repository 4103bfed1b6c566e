"""SIGTERM/SIGINT handling for a session (SPEC §5.7).

The first signal requests a clean stop: the loop ends at the next step boundary, ``end`` hooks
run and the final checkpoint is written. The stop request also ends every wait the runtime owns
(a worker waiting for the chief's checkpoint waits on the stop event, not in a sleep). A second
signal — SIGINT, or SIGTERM at least `DUPLICATE_SIGTERM_SECS` after the first — raises
`KeyboardInterrupt` at once on the main thread, which interrupts whatever blocks there (a hook
hanging in ``end``, a stuck close). Handlers are
installed only on the main thread and restored when the session closes.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Callable

__all__ = ["SignalHandlers", "DUPLICATE_SIGTERM_SECS"]

logger = logging.getLogger(__name__)

#: A second SIGTERM this soon after the first is a duplicate, not an escalation: when a
#: scheduler signals a whole process group (Slurm's scancel, Kubernetes), a launcher such as
#: torchrun also forwards the signal to its workers, which then get two SIGTERMs within
#: milliseconds; escalating would interrupt the final checkpoint the first one asked for.
DUPLICATE_SIGTERM_SECS = 1.0


class SignalHandlers:
    """SIGTERM/SIGINT → a clean stop at the next step boundary; a second one interrupts."""

    _SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), signal.SIGINT) if s is not None)

    def __init__(self, request_stop: Callable[..., Any]) -> None:
        self._request_stop = request_stop
        self._previous: dict[int, Any] = {}
        self._received: str | None = None
        self._received_at = 0.0
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not on the main thread: SIGTERM/SIGINT handlers not installed")
            return
        for signum in self._SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self._received is not None:
            if signum != signal.SIGINT and time.monotonic() - self._received_at < DUPLICATE_SIGTERM_SECS:
                logger.info("ignoring a second %s %.2f s after the first (a launcher forwarding the "
                            "scheduler's signal sends it twice)", name, time.monotonic() - self._received_at)
                return
            # The first stop did not end things in time: escalate, as a second Ctrl-C does.
            raise KeyboardInterrupt(f"second stop signal ({name} after {self._received}): interrupting now")
        if self._received is None:
            self._received, self._received_at = name, time.monotonic()
            # Locks may be held by the interrupted code: request the stop from another thread.
            threading.Thread(target=self._request_stop,
                             kwargs={"reason": f"received {name}"}, daemon=True).start()

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
