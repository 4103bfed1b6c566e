"""Events on an object store (SPEC §16): every upload is a new, immutable events object.

An object cannot be appended to, so `ObjectEventFile` — the object-store twin of
`supervisor.events.writer.EventFile`, with the same ``add``/``flush``/``close`` — uploads the
events gathered since its last upload as a **new** object, at most every ``flush_secs`` (and at
`flush`, at `sync` — before a session's checkpoint commits — and at `close`). Each object is a complete events file (a ``brain.Event:2`` version event,
then the records), named

    ``events.out.tfevents.<time>.<host>.<pid>.<writer>.<seq><suffix>``

with ``<time>`` the upload's time in seconds with microseconds (``1764172800.123456``, always
later than the writer's previous one) and ``<writer>``, ``<seq>`` zero-padded counters, so the
names of one writer sort in upload order. TensorBoard's directory loader
(``directory_watcher.DirectoryWatcher``) reads the events files of a directory in sorted name
order, one at a time, each to its end before the next, assuming that "old paths are never
modified after a newer path has been written" — which holds here: a name is written again only
to retry its own failed upload, before any newer name exists — and shows them as one run: one
curve per tag, every point once, steps in order. Because every name starts with its upload time,
to the microsecond, the objects of two writers in one directory sort in upload order too (a name
with the writer's creation time, or whole seconds as tensorboard's local files have, could put
one writer's new object before another's that TensorBoard already read: it would never read it).

What the writer does when an upload fails: botocore retries it (bounded, with backoff: see
`supervisor.checkpoint.storage.s3.store`); if it still fails, the records are **kept**, a WARNING says
so, and the next upload (the next ``flush_secs`` tick, `flush` or `close`) sends them again
under the same name (a plain ``PutObject`` replaces a half-known first attempt: no record is
written twice or lost). `flush` and `close` raise ``OSError`` naming the object while the upload
fails (at `close` the records are then lost: the message says how many). The training thread's
`add` raises only once more than ``MAX_UNSENT_BYTES`` of records wait for an upload (memory
stays bounded; still nothing is dropped).

``max_queue`` events waiting wake the writer thread early to encode them (as locally), but not to
upload: an object per ``max_queue`` events would flood the store with tiny objects (TensorBoard
pays a request per object). The first object (the version event alone) is uploaded at
construction, so a bad bucket or missing credentials fail there, naming the URL.
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
from supervisor.events.record import EVENTS_PREFIX, frame

__all__ = ["MAX_UNSENT_BYTES", "ObjectEventFile"]

logger = logging.getLogger(__name__)

#: Records waiting for an upload beyond which `ObjectEventFile.add` raises (see the module docstring).
MAX_UNSENT_BYTES = 64 << 20

_WRITER_IDS = itertools.count(1)


class ObjectEventFile:
    """Events written as new immutable objects under ``logdir`` (a URL); see the module docstring.

    Args:
        storage: the `Storage` of ``logdir`` (``storage_for(logdir, storage_options)``).
        logdir: the prefix the objects are written under (``s3://bucket/run``).
        suffix: appended to each object's name.
        flush_secs: the longest an added event waits before it is uploaded.
        max_queue: events waiting that wake the writer thread early to encode them.
        first: the serialised version event every object starts with.
        encode: turns what `add` was given into the serialised event, at write time.
    """

    def __init__(self, storage: Storage, logdir: str, suffix: str, *, flush_secs: float, max_queue: int,
                 first: bytes, encode: Callable[[Any], bytes]) -> None:
        self._storage = storage
        self._logdir = logdir
        self._suffix = suffix
        self._origin = "%s.%s.%06d" % (socket.gethostname(), os.getpid(), next(_WRITER_IDS))
        self._seq = itertools.count()
        self._last_time = 0.0
        self._head = frame(first)
        self._encode = encode
        self._flush_secs = flush_secs
        self._max_queue = max_queue
        self._pending: list[Any] = []
        self.added = 0  # events added so far (`sync`'s points)
        self._encoded = self._uploaded = 0  # events encoded into the unsent records / uploaded
        self._lock = threading.Lock()  # the pending list
        self._io_lock = threading.Lock()  # the unsent records and the uploads: one at a time, in order
        self._unsent: list[bytes] = []  # framed records encoded, not yet uploaded
        self._unsent_bytes = 0
        self._unsent_name: str | None = None  # the name their first upload attempt used
        self._error: BaseException | None = None  # the last failed upload's error; None once one succeeds
        self.path = ""  # the newest object uploaded
        self.uploads = 0  # objects uploaded so far
        self._closed = False
        self._upload(self._head, self._next_name())  # the version event: a bad URL or credentials fail here
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-events", daemon=True)
        self._thread.start()

    def add(self, data: Any) -> None:
        """Queues what ``encode`` makes one event of (no serialising, no I/O on the caller's
        thread); raises ``OSError`` only while uploads fail and too much waits (see above)."""
        error, waiting = self._error, self._unsent_bytes  # read once: the writer thread updates them
        if error is not None and waiting > MAX_UNSENT_BYTES:
            raise OSError(f"uploading events under {self._logdir} has failed and {waiting} bytes of records wait "
                          f"(more than {MAX_UNSENT_BYTES}): {error}") from error
        with self._lock:
            self._pending.append(data)
            self.added += 1
            wake = len(self._pending) >= self._max_queue
        if wake:
            self._wake.set()

    def flush(self) -> None:
        """Uploads every event added so far as one new object (none when there is nothing new);
        ``OSError`` when the upload fails (the records are kept for the next try)."""
        with self._io_lock:
            self._encode_pending()
            self._upload_unsent()

    def sync(self, upto: int) -> None:
        """Makes the first ``upto`` events added durable (uploaded); a no-op when they already
        are, else a `flush` (``OSError`` when the upload fails)."""
        if self._uploaded < upto:
            self.flush()

    def close(self) -> None:
        """Uploads what is left and stops the thread; twice is a no-op. ``OSError`` (naming the
        object and how many bytes of records are lost) when the last upload fails."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join()
        try:
            self.flush()
        except OSError as e:
            raise OSError(e.errno, f"the last events of {self._logdir} ({self._unsent_bytes} bytes of records) "
                                   f"could not be uploaded and are lost: {e.strerror or e}") from e

    # ------------------------------------------------------------ the writer thread
    def _run(self) -> None:
        due = time.monotonic() + self._flush_secs
        while not self._closed:
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()
            if self._closed:
                return
            with self._io_lock:
                self._encode_pending()
                if time.monotonic() < due:
                    continue  # woken by max_queue: encoded, uploaded at the tick
                due = time.monotonic() + self._flush_secs
                try:
                    self._upload_unsent()
                except OSError:
                    pass  # logged and kept by _upload_unsent; retried at the next tick

    def _encode_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        if batch:
            encode = self._encode
            data = b"".join(frame(encode(item)) for item in batch)
            self._unsent.append(data)
            self._unsent_bytes += len(data)
            self._encoded += len(batch)

    def _upload_unsent(self) -> None:
        if not self._unsent:
            self._uploaded = self._encoded
            return
        if self._unsent_name is None:  # kept until an upload succeeds: a retry replaces a first attempt
            self._unsent_name = self._next_name()  # that may have reached the server
        data = self._head + b"".join(self._unsent)
        try:
            self._upload(data, self._unsent_name)
        except OSError as e:
            self._error = e
            logger.warning("could not upload the events object %s (%d bytes of records kept, sent again at the "
                           "next flush): %s", self._unsent_name, self._unsent_bytes, e)
            raise
        self._unsent.clear()
        self._unsent_bytes = 0
        self._unsent_name = None
        self._error = None
        self._uploaded = self._encoded

    def _upload(self, data: bytes, name: str) -> None:
        """One ``PutObject`` (a plain one: a retry under the same name is idempotent)."""
        self._storage.write_atomic(name, data)
        self.path = name
        self.uploads += 1

    def _next_name(self) -> str:
        stamp = self._last_time = max(time.time(), self._last_time + 1e-6)
        name = "%s%.6f.%s.%06d%s" % (EVENTS_PREFIX, stamp, self._origin, next(self._seq), self._suffix)
        return self._storage.join(self._logdir, name)
