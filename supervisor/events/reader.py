"""The one reader of events files: `read_scalars` (eval directories, summary directories).

Every reader of the project uses it (`supervisor.estimator.metrics.read_eval_events`,
`hooks.read_eval_metrics`, the sidecar's `evaluated_steps`, ``train_and_evaluate``'s record of
what was evaluated), so they agree on what a directory holds:

- the files named ``events.out.tfevents.*``, in name order (TensorBoard's order; the writers
  name files so that it is their creation order);
- regular files only: each is opened with ``O_NONBLOCK`` and checked with ``fstat``, so a FIFO
  or a device named like an events file is skipped with a WARNING ("not a regular file")
  instead of blocking the reader;
- a file is read up to its first torn or damaged record (a bad CRC, a record cut short, an
  event that does not parse), as TensorBoard does;
- a scalar is a ``simple_value`` summary (what `SummaryWriter`, `EvalEventsFile` and TF1's
  evaluators write) or a one-element numeric ``tensor`` summary (TF2's ``tf.summary.scalar``).

An object-store URL (``s3://bucket/run/eval``) is read through the storage seam: the objects
named ``events.out.tfevents.*`` directly under that prefix, in name order, each read whole with
one ``GetObject`` (events objects are immutable: see `supervisor.events.object_writer`),
``OBJECT_READERS`` at a time; one that cannot be read (deleted since the listing, the store
failing after its retries) is skipped with a WARNING, as a local file that cannot be read is.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Iterator, Mapping

from supervisor.checkpoint.storage import Storage
from supervisor.events.location import locate
from supervisor.events.record import EVENTS_PREFIX, iter_records, parse_event

__all__ = ["check_regular", "event_scalars", "open_regular_file", "read_scalars"]

logger = logging.getLogger(__name__)

#: Objects of an object-store directory read at once.
OBJECT_READERS = 16


def read_scalars(directory: str | os.PathLike,
                 storage_options: Mapping[str, Any] | None = None) -> dict[int, dict[str, float]]:
    """The scalars of the events files in ``directory`` (a local path or an object-store URL) as
    ``{step: {tag: value}}``, sorted by step (a later event wins for the same step and tag);
    empty when there is no such directory. See the module docstring for what is read.
    ``storage_options``: for a URL, the object-store client's options (``storage_for``)."""
    storage, directory = locate(directory, storage_options)
    by_step: dict[int, dict[str, float]] = {}
    for path, data in _events_files(storage, directory):
        for record in iter_records(data, path):
            try:
                event = parse_event(record)
            except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: a damaged record
                logger.warning("stopped reading %s at a damaged event: %s", path, e)
                break
            scalars = event_scalars(event)
            if scalars:
                by_step.setdefault(int(event.step), {}).update(scalars)
    return dict(sorted(by_step.items()))


def _events_files(storage: Storage | None, directory: str) -> Iterator[tuple[str, bytes]]:
    """``(path, bytes)`` of each events file of ``directory``, in name order."""
    try:
        names = os.listdir(directory) if storage is None else storage.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    names = sorted(n for n in names if n.startswith(EVENTS_PREFIX))
    if storage is None:
        for name in names:
            path = os.path.join(directory, name)
            yield path, _read_regular(path)
        return
    paths = [storage.join(directory, name) for name in names]
    # One request per object, OBJECT_READERS at a time: an eval directory holds an object per
    # evaluation, and the early-stopping hooks read it again and again on the training thread.
    with ThreadPoolExecutor(max_workers=max(1, min(OBJECT_READERS, len(paths)))) as pool:
        yield from zip(paths, pool.map(functools.partial(_read_object, storage), paths))


def _read_object(storage: Storage, path: str) -> bytes:
    """The bytes of the object ``path``, or b"" with a WARNING when it cannot be read (deleted
    since the listing, a prefix named like an events file, the store failing), as locally."""
    try:
        return storage.read_bytes(path)
    except OSError as e:
        logger.warning("not reading %s: %s", path, e)
        return b""


def event_scalars(event: Any) -> dict[str, float]:
    """``{tag: value}`` of the scalar summaries of one ``Event`` (see the module docstring)."""
    scalars = {}
    for value in event.summary.value:
        if value.HasField("simple_value"):
            scalars[value.tag] = value.simple_value
        elif value.HasField("tensor"):  # TF2-style scalar summaries
            scalar = _tensor_scalar(value.tensor)
            if scalar is not None:
                scalars[value.tag] = scalar
    return scalars


def _tensor_scalar(tensor: Any) -> float | None:
    from tensorboard.util import tensor_util  # heavy (numpy, protobuf): only for TF2-style summaries

    array = tensor_util.make_ndarray(tensor)
    if array.size == 1 and array.dtype.kind in "fiu":
        return float(array.reshape(()))
    return None


def check_regular(fd: int, path: str) -> os.stat_result:
    """``fstat(fd)``; raises ``OSError(EINVAL, "not a regular file", path)`` for anything else."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", path)
    return st


def open_regular_file(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file only: opened with ``O_NONBLOCK`` and checked with
    ``fstat``, so a FIFO or a device never blocks the caller.

    Raises:
        OSError: the file cannot be opened, or (``EINVAL``) it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        check_regular(fd, path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_regular(path: str) -> bytes:
    """The bytes of ``path`` if it is a regular file, else b"" (with a WARNING); never blocks."""
    try:
        with open_regular_file(path) as f:
            return f.read()
    except OSError as e:
        logger.warning("not reading %s: %s", path, e.strerror or e)
        return b""
