"""TensorBoard events: one writer, the eval events file, one reader (floor 2: imports only the
standard library and, lazily, tensorboard's protobufs).

- `record`: the format, written once (TFRecord framing, masked CRC-32C, ``Event`` protos).
- `EventFile` (`writer`): the batched, threaded writer behind `supervisor.summary.SummaryWriter`.
- `EvalEventsFile` (`eval_events`): one event per evaluation, appended and fsynced.
- `read_scalars` (`reader`): every reader's ``{step: {tag: value}}``; regular files only, in
  file order, up to a torn record.
"""
from __future__ import annotations

from supervisor.events.eval_events import EvalEventsFile
from supervisor.events.reader import check_regular, event_scalars, open_regular_file, read_scalars
from supervisor.events.record import EVENTS_PREFIX, FILE_VERSION, frame
from supervisor.events.writer import EventFile, event_file_name

__all__ = ["EVENTS_PREFIX", "FILE_VERSION", "EvalEventsFile", "EventFile", "check_regular", "event_file_name",
           "event_scalars", "frame", "open_regular_file", "read_scalars"]
