"""The one events-file writer behind `supervisor.summary.SummaryWriter`: TFRecord framing, batched writes.

Same file and format as ``tensorboard.summary.writer.event_file_writer.EventFileWriter``
(``events.out.tfevents.<time>.<host>.<pid>.<uid><suffix>``, a ``brain.Event:2`` version event
first, each record ``length, masked CRC-32C of length, data, masked CRC-32C of data``), read
back by TensorBoard's own loader in the tests. What differs is *when* the work happens:
tensorboard's writer wakes its thread for every event, and that thread computes the CRC-32C in
pure Python (~20 µs for an 80-byte event) while holding the GIL, so in a training loop every
summary costs the training thread a thread hand-over or two. Here what an event is made of
(``encode`` turns it into bytes) is appended to a list on the caller's thread; the writer
thread wakes every ``flush_secs`` (or when ``max_queue`` events wait) and encodes, frames,
writes and flushes the whole batch at once.

What a reader sees is unchanged: tensorboard's writer also made events visible only when it
flushed (every ``flush_secs``, or at `flush`/`close`), since its file object buffers.

`sync` makes the events added up to a point durable (written, flushed and fsynced, with the
directory entry of the file): what a checkpoint's commit waits for, so that the summaries of the
steps a checkpoint holds survive a crash right after it (`supervisor.summary.SummaryWriter.sync_point`).
Both writers count what was added (``added``) and what is durable, so a sync after a flush that
already wrote everything costs nothing.
"""
from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from supervisor.checkpoint.storage import Storage
from supervisor.events.object_writer import ObjectEventFile
from supervisor.events.record import EVENTS_PREFIX, frame

__all__ = ["EventFile", "event_file_name", "open_event_file"]

logger = logging.getLogger(__name__)

_UID = itertools.count(1)


def event_file_name(logdir: str, suffix: str) -> str:
    """A new events file's path, named as tensorboard names it. TensorBoard reads a directory's
    files in name order, so the per-process counter is zero-padded: two files of one second
    keep their creation order past the 9th (tensorboard's ``...pid.9`` sorts after ``.10``)."""
    name = EVENTS_PREFIX + "%010d.%s.%s.%06d" % (time.time(), socket.gethostname(), os.getpid(), next(_UID))
    return os.path.join(logdir, name + suffix)


def open_event_file(logdir: str, suffix: str, *, storage: Storage | None, flush_secs: float, max_queue: int,
                    first: bytes, encode: Callable[[Any], bytes]) -> EventFile | ObjectEventFile:
    """The events writer of ``logdir``: an `EventFile` appended to locally (``storage`` None: an
    existing local directory), an `ObjectEventFile` (a new object every ``flush_secs``) on an
    object store (``storage``: `supervisor.events.location.locate`'s)."""
    if storage is None:
        return EventFile(logdir, suffix, flush_secs=flush_secs, max_queue=max_queue, first=first, encode=encode)
    return ObjectEventFile(storage, logdir, suffix, flush_secs=flush_secs, max_queue=max_queue, first=first,
                           encode=encode)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EventFile:
    """Appends serialised events to a new events file; see the module docstring.

    Args:
        logdir: an existing directory.
        suffix: appended to the file name.
        flush_secs: the longest an added event waits before it is written and flushed.
        max_queue: events waiting that wake the writer thread early.
        first: the serialised first event (the file version), written and flushed at once.
        encode: turns what `add` was given into the serialised event, at write time.
    """

    def __init__(self, logdir: str, suffix: str, *, flush_secs: float, max_queue: int, first: bytes,
                 encode: Callable[[Any], bytes]) -> None:
        self.path = event_file_name(logdir, suffix)
        self._file = open(self.path, "wb")
        self._file.write(frame(first))
        self._file.flush()
        self._encode = encode
        self._flush_secs = flush_secs
        self._max_queue = max_queue
        self._pending: list[Any] = []
        self.added = 0  # events added so far (`sync`'s points)
        self._written = self._synced = 0  # events written to the file / fsynced with it
        self._dir_synced = False
        self._lock = threading.Lock()  # the pending list
        self._io_lock = threading.Lock()  # the file: one batch at a time, in order (taken before _lock)
        self._wake = threading.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="supervisor-events", daemon=True)
        self._thread.start()

    def add(self, data: Any) -> None:
        """Queues what ``encode`` makes one event of (cheap: no serialising, no framing, no I/O
        on the caller's thread)."""
        if self._error is not None:
            raise OSError(f"writing the events file {self.path} failed: {self._error}") from self._error
        with self._lock:
            self._pending.append(data)
            self.added += 1
            wake = len(self._pending) >= self._max_queue
        if wake:
            self._wake.set()

    def flush(self) -> None:
        """Writes every event added so far and flushes the file (on the caller's thread)."""
        with self._io_lock:  # the batch is taken under it: two flushes write their batches in order
            with self._lock:
                batch, self._pending = self._pending, []
            if self._file.closed:
                return
            if batch:
                encode = self._encode
                self._file.write(b"".join(frame(encode(data)) for data in batch))
            self._file.flush()
            self._written += len(batch)

    def sync(self, upto: int) -> None:
        """Makes the first ``upto`` events added durable: written, flushed and fsynced (with the
        directory entry of the file, once); a no-op when they already are. ``OSError`` when the
        file cannot be written."""
        if self._synced >= upto:
            return
        self.flush()
        with self._io_lock:
            if self._file.closed:
                return
            written = self._written
            os.fsync(self._file.fileno())
            if not self._dir_synced:
                _fsync_directory(os.path.dirname(self.path))
                self._dir_synced = True
            self._synced = max(self._synced, written)

    def close(self) -> None:
        """Writes what is pending, stops the thread and closes the file; twice is a no-op."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join()
        try:
            self.flush()
        finally:
            with self._io_lock:
                self._file.close()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._flush_secs)
            self._wake.clear()
            if self._closed:
                return
            try:
                self.flush()
            except Exception as e:  # noqa: BLE001 - reported to the next add() on the training thread
                logger.error("writing the events file %s failed: %s", self.path, e)
                self._error = e
                return
