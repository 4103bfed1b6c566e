"""TensorBoard events: one writer, the eval events file, one reader (floor 2: imports only the
standard library, the storage seam `supervisor.checkpoint.storage` and, lazily, tensorboard's
protobufs).

- `record`: the format, written once (TFRecord framing, masked CRC-32C, ``Event`` protos).
- `EventFile` (`writer`): the batched, threaded writer behind `supervisor.summary.SummaryWriter`;
  on an object store `ObjectEventFile` (`object_writer`): a new immutable object every
  ``flush_secs`` (`open_event_file` picks one).
- `EvalEventsFile` (`eval_events`): one event per evaluation, appended and fsynced.
- `read_scalars` (`reader`): every reader's ``{step: {tag: value}}``; regular files only, in
  file order, up to a torn record.
- Every directory may be a local path or an object-store URL (``s3://bucket/run``, SPEC §16):
  `locate` (`location`) says which; local paths keep their POSIX code, unchanged.
"""
from __future__ import annotations

from supervisor.events.eval_events import EvalEventsFile
from supervisor.events.location import locate
from supervisor.events.object_writer import ObjectEventFile
from supervisor.events.reader import check_regular, event_scalars, open_regular_file, read_scalars
from supervisor.events.record import EVENTS_PREFIX, FILE_VERSION, frame
from supervisor.events.writer import EventFile, event_file_name, open_event_file

__all__ = ["EVENTS_PREFIX", "FILE_VERSION", "EvalEventsFile", "EventFile", "ObjectEventFile", "check_regular",
           "event_file_name", "event_scalars", "frame", "locate", "open_event_file", "open_regular_file",
           "read_scalars"]
