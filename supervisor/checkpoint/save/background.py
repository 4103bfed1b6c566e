"""The background writer thread (SPEC §5.2): at most one save in flight.

`BackgroundWriter` runs one job at a time on a background thread. The manager waits for the previous job before it captures the next save (the staging buffers are
being written from), so there is never a queue: a save that falls due while one is writing
waits, and the wait is measured for the log. Jobs handle and report their own errors; the
thread only guards against a job that escapes its own handling.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

__all__ = ["BackgroundWriter"]

logger = logging.getLogger(__name__)


class BackgroundWriter:
    """Runs one job at a time, each on its own short-lived thread.

    A thread per save (about 0.1 ms to start, nothing next to a checkpoint) rather than a
    resident one: the thread is non-daemon, so a process that exits without ``close()`` still
    finishes the save in flight instead of dropping it, and no idle thread keeps it alive.

    Example::

        writer = BackgroundWriter()
        writer.submit(job)          # returns at once
        waited_secs = writer.wait() # blocks until the job is done
        writer.close()              # waits for a job in flight; no more jobs
    """

    def __init__(self, name: str = "supervisor-checkpoint-writer") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._threads: list[threading.Thread] = []

    @property
    def busy(self) -> bool:
        """Whether a job is running."""
        return self._busy

    def submit(self, job: Callable[[], None], after: Callable[[], None] | None = None) -> None:
        """Starts ``job`` on a new thread; the previous job must be done (call `wait` first).

        ``after`` runs on the same thread once the job is done and `wait` has returned (e.g.
        deleting what retention dropped), so the next save does not wait for it.
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("the checkpoint writer is closed; no more saves can be written")
            if self._busy:
                raise RuntimeError("a save is already in flight; wait() for it before submitting another")
            self._busy = True
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=self._run, args=(job, after), name=self._name)
            self._threads.append(thread)
        thread.start()

    def wait(self) -> float:
        """Blocks until no job is in flight; returns the seconds it waited (0.0 if idle)."""
        with self._cond:
            if not self._busy:
                return 0.0
            start = time.perf_counter()
            while self._busy:
                self._cond.wait()
            return time.perf_counter() - start

    def close(self) -> None:
        """Lets a job in flight finish and joins its thread; later submits fail. Idempotent."""
        with self._cond:
            self._closed = True
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    def _run(self, job: Callable[[], None], after: Callable[[], None] | None) -> None:
        try:
            job()
        except BaseException:  # noqa: BLE001 - jobs report their own errors; this is a last resort
            logger.exception("the checkpoint writer's job failed outside its own error handling")
        finally:
            del job  # drop the payload before signalling: the next capture reuses its buffers
            with self._cond:
                self._busy = False
                self._cond.notify_all()
        if after is not None:
            try:
                after()
            except Exception:  # noqa: BLE001 - cleanup only; the save itself is committed
                logger.exception("the checkpoint writer's cleanup failed")
