"""The eval events file (SPEC §9, §10.1): one event per evaluation, appended and fsynced.

Eval metrics are written with bare tags (``loss``, ``accuracy``) into ``model_dir/eval`` or
``eval_<name>``, at the evaluated checkpoint's step. Each evaluation appends one event to this
process's events file in that directory and fsyncs it before returning, without a writer
thread, so the early-stopping hooks of a trainer see the result as soon as it exists.

On an object store (``directory`` a URL such as ``s3://bucket/run/eval``) nothing can be
appended to: each evaluation is uploaded as a new immutable events object (a version event and
the metrics event), named like a local file (``events.out.tfevents.<time>.<host>.<pid>.eval``)
with a time that grows with every write, so the objects sort in evaluation order and
TensorBoard reads them as one run. It exists, whole, once the write returns.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any, Mapping

from supervisor.checkpoint.storage import Storage, is_url
from supervisor.events.location import locate
from supervisor.events.reader import check_regular
from supervisor.events.record import EVENTS_PREFIX, frame, scalars_event, session_log_event, version_event

__all__ = ["EvalEventsFile"]

logger = logging.getLogger(__name__)


class EvalEventsFile:
    """This process's events file in one eval directory; each `write` appends and fsyncs.

    A write that fails (disk full, I/O error) can leave a torn record at the end of the file, and
    every reader (TensorBoard, `supervisor.events.read_scalars`) stops reading a file at a torn
    record: so the file is cut back to its last complete record where the OS allows, and the
    next `write` starts a new events file (the names sort in time order, and TensorBoard reads
    the files of a directory in turn). The error is raised, naming the path and the step.
    On an object store every write is a new object (see the module docstring).

    Args:
        directory: a local directory (created on the first write) or an object-store URL.
        storage_options: for a URL, the object-store client's options (``storage_for``).
    """

    def __init__(self, directory: str, storage_options: Mapping[str, Any] | None = None, *,
                 storage: Storage | None = None) -> None:
        if storage is not None and is_url(directory):  # a client already made (a session's)
            self._storage, self.directory = storage, directory.rstrip("/")
        else:
            self._storage, self.directory = locate(directory, storage_options)
        self.path: str | None = None
        self._last_time = 0.0

    def write(self, metrics: Mapping[str, float], step: int) -> None:
        """Writes ``metrics`` (bare tags) as one event at ``step``."""
        # Built first: a bad tag or value raises before any file exists.
        now = time.time()
        self._write_event(now, scalars_event(now, int(step), [(tag, float(v)) for tag, v in metrics.items()]), step)

    def write_start(self, step: int) -> None:
        """Writes a ``SessionLog.START`` at ``step``: TensorBoard then drops the evaluations
        written before it at steps >= ``step`` (a killed run's, after the checkpoint resumed)."""
        now = time.time()
        self._write_event(now, session_log_event(now, int(step), "START", "", ""), step)

    def _write_event(self, now: float, event: bytes, step: int) -> None:
        if self._storage is not None:
            self._upload(self._storage, event, now, step)
            return
        records = []
        new = self.path is None
        if new:
            os.makedirs(self.directory, exist_ok=True)
            self.path = os.path.join(self.directory, f"{EVENTS_PREFIX}{time.time():.6f}."
                                                     f"{socket.gethostname()}.{os.getpid()}.eval")
            records.append(version_event(now))
        records.append(event)
        try:
            _append(self.path, b"".join(frame(r) for r in records), new=new)
        except OSError as e:
            path, self.path = self.path, None  # never append after a record that may be torn
            raise OSError(e.errno, f"could not write the eval metrics of step {step} to {path}: {e.strerror or e}; "
                                   "the next evaluation starts a new events file") from e
        logger.debug("wrote eval metrics of step %d to %s", step, self.path)

    def _upload(self, storage: Storage, event: bytes, now: float, step: int) -> None:
        """One new object: the version event and ``event`` (a plain ``PutObject``: the name is
        this process's, and a retry of it is idempotent)."""
        stamp = self._last_time = max(now, self._last_time + 1e-6)  # names sort in write order
        path = storage.join(self.directory, f"{EVENTS_PREFIX}{stamp:.6f}.{socket.gethostname()}.{os.getpid()}.eval")
        try:
            storage.write_atomic(path, frame(version_event(now)) + frame(event))
        except OSError as e:
            raise OSError(e.errno, f"could not write the eval metrics of step {step} to {path}: "
                                   f"{e.strerror or e}") from e
        self.path = path
        logger.debug("wrote eval metrics of step %d to %s", step, path)


def _append(path: str, data: bytes, *, new: bool) -> None:
    """Appends ``data`` to the regular file ``path`` and fsyncs it; on failure, cuts the file back
    to its size before (removes it when it was new), best effort."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT | os.O_EXCL if new else 0)
    fd = os.open(path, flags, 0o666)
    try:
        size = check_regular(fd, path).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError:
            _cut_back(fd, path, size)
            raise
    finally:
        os.close(fd)


def _cut_back(fd: int, path: str, size: int) -> None:
    try:
        if size == 0:
            os.unlink(path)
        else:
            os.ftruncate(fd, size)
    except OSError as e:
        logger.debug("could not cut %s back to %d bytes after a failed write: %s", path, size, e)
