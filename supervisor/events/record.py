"""TensorBoard's events format, written once: TFRecord framing, masked CRC-32C, ``Event`` protos.

An events file is a sequence of TFRecords, each ``length (u64 LE), masked CRC-32C of length,
data, masked CRC-32C of data``; the data is a serialised ``tensorboard`` ``Event``, the first
one a ``brain.Event:2`` file version. `supervisor.events.writer`, `supervisor.events.eval_events`
and `supervisor.events.reader` build on these functions and nothing else of the format.

The protobuf modules and tensorboard's CRC are imported on first use (`protos`, `masked_crc32c`):
they cost ~100 ms, paid only by processes that write or read events.
"""
from __future__ import annotations

import functools
import logging
import struct
from types import ModuleType
from typing import Any, Iterable, Iterator

__all__ = ["EVENTS_PREFIX", "FILE_VERSION", "frame", "iter_records", "masked_crc32c", "parse_event", "protos",
           "scalars_event", "session_log_event", "version_event"]

logger = logging.getLogger(__name__)

EVENTS_PREFIX = "events.out.tfevents."
FILE_VERSION = "brain.Event:2"


@functools.cache
def protos() -> tuple[ModuleType, ModuleType]:
    """tensorboard's ``(event_pb2, summary_pb2)``."""
    from tensorboard.compat.proto import event_pb2, summary_pb2  # heavy (protobuf): on first use

    return event_pb2, summary_pb2


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C of ``data`` (TFRecord's checksum), as tensorboard computes it."""
    return _masked_crc32c()(data)


@functools.cache
def _masked_crc32c() -> Any:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as crc  # heavy: on first use

    return crc


def frame(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC-32C, the data, the data's masked CRC-32C."""
    crc = _masked_crc32c()
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", crc(header)) + data + struct.pack("<I", crc(data))


def iter_records(data: bytes, path: str) -> Iterator[bytes]:
    """The complete, intact TFRecords of ``data``, up to the first torn or damaged one (as
    TensorBoard reads); ``path`` names the file in the DEBUG line about a torn tail."""
    crc = _masked_crc32c()
    offset = 0
    while offset + 12 <= len(data):
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        end = offset + 12 + length + 4
        if struct.unpack("<I", data[offset + 8:offset + 12])[0] != crc(header) or end > len(data):
            break
        record = data[offset + 12:end - 4]
        if struct.unpack("<I", data[end - 4:end])[0] != crc(record):
            break
        yield record
        offset = end
    if offset < len(data):
        logger.debug("%s: %d bytes after the last complete record (torn or being written)", path, len(data) - offset)


def version_event(wall_time: float, writer: str | None = None) -> bytes:
    """The serialised first event of a file (``file_version``), with ``source_metadata.writer``
    when ``writer`` is given."""
    event_pb2, _ = protos()
    event = event_pb2.Event(wall_time=wall_time, file_version=FILE_VERSION)
    if writer is not None:
        event.source_metadata.writer = writer
    return event.SerializeToString()


def scalars_event(wall_time: float, step: int, scalars: Iterable[tuple[str, float]]) -> bytes:
    """The serialised event of ``(tag, value)`` scalars at ``step``, as ``simple_value`` summaries."""
    event_pb2, summary_pb2 = protos()
    value = summary_pb2.Summary.Value
    summary = summary_pb2.Summary(value=[value(tag=tag, simple_value=x) for tag, x in scalars])
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


def session_log_event(wall_time: float, step: int, status: str, checkpoint_path: str = "", msg: str = "") -> bytes:
    """The serialised ``SessionLog`` event (``status``: ``"START"``, ``"STOP"``, ``"CHECKPOINT"``)."""
    event_pb2, _ = protos()
    session_log = event_pb2.SessionLog(status=event_pb2.SessionLog.SessionStatus.Value(status),
                                       checkpoint_path=checkpoint_path, msg=msg)
    return event_pb2.Event(wall_time=wall_time, step=step, session_log=session_log).SerializeToString()


def parse_event(record: bytes) -> Any:
    """The ``Event`` of one record; raises protobuf's ``DecodeError`` for a damaged one."""
    event_pb2, _ = protos()
    return event_pb2.Event.FromString(record)
