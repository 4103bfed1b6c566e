"""The background writer thread (SPEC §5.2): at most one save in flight.

`BackgroundWriter` runs one job at a time on a dedicated thread, started at the first job. The
manager waits for the previous job before it captures the next save (the staging buffers are
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
    """A single worker thread with a one-job slot.

    Example::

        writer = BackgroundWriter()
        writer.submit(job)          # returns at once
        waited_secs = writer.wait() # blocks until the job is done
        writer.close()              # finishes a job in flight, stops the thread
    """

    def __init__(self, name: str = "supervisor-checkpoint-writer") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        return self._busy

    def submit(self, job: Callable[[], None]) -> None:
        """Hands ``job`` to the thread; the previous job must be done (call `wait` first)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the checkpoint writer is closed; no more saves can be written")
            if self._busy:
                raise RuntimeError("a save is already in flight; wait() for it before submitting another")
            if self._thread is None:
                # Daemon: a process that exits without close() must not hang on an idle writer;
                # an interrupted write leaves only a temp directory, removed at the next open.
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._job = job
            self._busy = True
            self._cond.notify_all()

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
        """Lets a job in flight finish, then stops and joins the thread. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._closed:
                    self._cond.wait()
                job, self._job = self._job, None
            if job is None:
                return
            try:
                job()
            except BaseException:  # noqa: BLE001 - jobs report their own errors; this is a last resort
                logger.exception("the checkpoint writer's job failed outside its own error handling")
            finally:
                del job  # drop the payload (staging buffers stay with the manager)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
