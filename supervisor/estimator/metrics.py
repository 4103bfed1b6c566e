"""Evaluation metrics: aggregation of step outputs and the eval event files (SPEC §9, §10.1).

- A metric is either the mean over evaluation batches of a scalar the ``eval_step`` returns
  (every batch weighs the same, as TF's ``tf.metrics.mean`` of a per-batch value), or an object
  with ``update(outputs, batch)``, ``compute()`` and ``reset()`` (torchmetrics-compatible, no
  dependency). A ``compute()`` returning a dict (torchmetrics' ``MetricCollection``, Keras'
  ``DictMetric``) gives one metric per key, tagged ``name/key`` (`flatten_metric`).
- Eval metrics are written with bare tags (``loss``, ``accuracy``) into ``model_dir/eval`` or
  ``eval_<name>``, at the evaluated checkpoint's step. Each evaluation appends one event to this
  process's events file in that directory and fsyncs it before returning, without a writer
  thread, so the early-stopping hooks of a trainer see the result as soon as it exists.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
import time
from typing import Any, BinaryIO, Iterator, Mapping

import torch

__all__ = ["MeanAggregator", "check_metric_objects", "EvalEventsFile", "flatten_metric", "read_eval_events",
           "to_float", "EVENTS_PREFIX", "open_regular_file"]

logger = logging.getLogger(__name__)

_METRIC_METHODS = ("update", "compute", "reset")
EVENTS_PREFIX = "events.out.tfevents."


def check_metric_objects(metrics: Any) -> dict[str, Any]:
    """Validates ``metrics={name: obj}`` (None: none); each object needs update/compute/reset."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a dict of name -> metric object (with update(outputs, batch), "
                        f"compute() and reset()), got {metrics!r}")
    for name, obj in metrics.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"metric names must be non-empty strings, got {name!r}")
        missing = [m for m in _METRIC_METHODS if not callable(getattr(obj, m, None))]
        if missing:
            raise TypeError(f"metrics[{name!r}] must have update(outputs, batch), compute() and reset(); "
                            f"{type(obj).__name__} lacks {', '.join(missing)}")
    return dict(metrics)


def to_float(name: str, value: Any) -> float:
    """A metric value as a Python float; names the metric when it is not a scalar."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"eval metric {name!r} must be a scalar, got a tensor of shape {tuple(value.shape)}; "
                            "reduce it first, e.g. value.mean()")
        return float(value.detach().reshape(()).item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"eval metric {name!r} must be a number or a scalar tensor, got {value!r}") from None


def flatten_metric(name: str, value: Any) -> dict[str, float]:
    """A computed metric as ``{tag: float}``: a number or scalar tensor is ``{name: value}``; a
    mapping (Keras' ``DictMetric``, torchmetrics' ``MetricCollection``) is flattened into
    ``name/key`` tags, recursively (``{"errors/mse": 0.1, "errors/mae": 0.2}``). The one rule
    `Estimator.evaluate`, ``train_and_evaluate`` and `SidecarEvaluator` use."""
    if isinstance(value, Mapping):
        flat: dict[str, float] = {}
        for key, inner in value.items():
            flat.update(flatten_metric(f"{name}/{key}", inner))
        return flat
    return {name: to_float(name, value)}


class MeanAggregator:
    """Means of the scalars the evaluation steps return, accumulated without a host sync per step."""

    def __init__(self) -> None:
        self._sums: dict[str, Any] = {}
        self._counts: dict[str, int] = {}

    def add(self, outputs: Mapping[str, Any]) -> None:
        for name, value in outputs.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise TypeError(f"eval_step output {name!r} must be a scalar, got a tensor of shape "
                                    f"{tuple(value.shape)}; return value.mean() or a metric object")
                value = value.detach().reshape(()).double()
            self._sums[name] = self._sums.get(name, 0.0) + value
            self._counts[name] = self._counts.get(name, 0) + 1

    def result(self) -> dict[str, float]:
        return {name: to_float(name, total) / self._counts[name] for name, total in self._sums.items()}


class EvalEventsFile:
    """This process's events file in one eval directory; each `write` appends and fsyncs.

    A write that fails (disk full, I/O error) can leave a torn record at the end of the file, and
    every reader (TensorBoard, the early-stopping hooks, `read_eval_events`) stops reading a file
    at a torn record: so the file is cut back to its last complete record where the OS allows,
    and the next `write` starts a new events file (the names sort in time order, and TensorBoard
    reads the files of a directory in turn). The error is raised, naming the path and the step.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path: str | None = None

    def write(self, metrics: Mapping[str, float], step: int) -> None:
        """Writes ``metrics`` (bare tags) as one event at ``step``."""
        from tensorboard.compat.proto import event_pb2, summary_pb2  # heavy (protobuf): on first use

        values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
                  for tag, value in metrics.items()]
        records = []
        new = self.path is None
        if new:
            os.makedirs(self.directory, exist_ok=True)
            self.path = os.path.join(self.directory, f"{EVENTS_PREFIX}{time.time():.6f}."
                                                     f"{socket.gethostname()}.{os.getpid()}.eval")
            records.append(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        records.append(event_pb2.Event(wall_time=time.time(), step=int(step),
                                       summary=summary_pb2.Summary(value=values)))
        try:
            _append(self.path, b"".join(_frame(r.SerializeToString()) for r in records), new=new)
        except OSError as e:
            path, self.path = self.path, None  # never append after a record that may be torn
            raise OSError(e.errno, f"could not write the eval metrics of step {step} to {path}: {e.strerror or e}; "
                                   "the next evaluation starts a new events file") from e
        logger.debug("wrote eval metrics of step %d to %s", step, self.path)


def _frame(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the data, the data's masked CRC-32C."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # heavy: on first use

    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def _append(path: str, data: bytes, *, new: bool) -> None:
    """Appends ``data`` to the regular file ``path`` and fsyncs it; on failure, cuts the file back
    to its size before (removes it when it was new), best effort."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT | os.O_EXCL if new else 0)
    fd = os.open(path, flags, 0o666)
    try:
        size = _check_regular(fd, path).st_size
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


def _check_regular(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", path)
    return st


def read_eval_events(directory: str | os.PathLike) -> dict[int, dict[str, float]]:
    """The scalar metrics of the events files in ``directory`` as ``{step: {tag: value}}``, by
    step (a later file wins for the same step and tag); empty when there is no such directory.

    Only regular files are read: each is opened with ``O_NONBLOCK`` and checked with ``fstat``,
    so a FIFO or a device named like an events file is skipped with a WARNING ("not a regular
    file") instead of blocking the reader. A file is read up to its first torn or damaged
    record, as TensorBoard does. Scalars are ``simple_value`` summaries (what `EvalEventsFile`
    and TensorFlow's evaluators write).
    """
    from tensorboard.compat.proto import event_pb2  # heavy (protobuf): on first use

    directory = os.fspath(directory)
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(EVENTS_PREFIX))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    by_step: dict[int, dict[str, float]] = {}
    for name in names:
        data = _read_regular(os.path.join(directory, name))
        for record in _records(data, os.path.join(directory, name)):
            try:
                event = event_pb2.Event.FromString(record)
            except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: a damaged record
                logger.warning("stopped reading %s at a damaged event: %s", name, e)
                break
            scalars = {v.tag: v.simple_value for v in event.summary.value if v.HasField("simple_value")}
            if scalars:
                by_step.setdefault(int(event.step), {}).update(scalars)
    return dict(sorted(by_step.items()))


def open_regular_file(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file only: opened with ``O_NONBLOCK`` and checked with
    ``fstat``, so a FIFO or a device never blocks the caller.

    Raises:
        OSError: the file cannot be opened, or (``EINVAL``) it is not a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        _check_regular(fd, path)
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


def _records(data: bytes, path: str) -> Iterator[bytes]:
    """The complete, intact TFRecords of ``data``, up to the first torn or damaged one."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c  # heavy: on first use

    offset = 0
    while offset + 12 <= len(data):
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        end = offset + 12 + length + 4
        if struct.unpack("<I", data[offset + 8:offset + 12])[0] != masked_crc32c(header) or end > len(data):
            break
        record = data[offset + 12:end - 4]
        if struct.unpack("<I", data[end - 4:end])[0] != masked_crc32c(record):
            break
        yield record
        offset = end
    if offset < len(data):
        logger.debug("%s: %d bytes after the last complete record (torn or being written)", path, len(data) - offset)
