"""SummaryWriter: events TensorBoard itself reads back; SummaryWriterCache; in-memory twin."""
from __future__ import annotations

import glob
import inspect
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from supervisor.summary import SummaryWriter, SummaryWriterCache
from supervisor.testing import InMemorySummaryWriter


@pytest.fixture(autouse=True)
def _clear_cache():
    yield
    SummaryWriterCache.clear()


def accumulate(logdir):
    events = EventAccumulator(str(logdir))
    events.Reload()
    return events


def session_logs(logdir):
    logs = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in LegacyEventFileLoader(path).Load():
            if event.HasField("session_log"):
                log = event.session_log
                logs.append((log.SessionStatus.Name(log.status), event.step, log.checkpoint_path, log.msg))
    return logs


@pytest.mark.parametrize(
    "value",
    [0.25, 1, np.float32(0.25), torch.tensor(0.25), torch.tensor([0.25]), torch.tensor(0.25, dtype=torch.float64)],
    ids=["float", "int", "numpy", "0-dim", "1-element", "float64"],
)
def test_scalar_values_round_trip(tmp_path, value):
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_scalar("loss", value, 7)
    [event] = accumulate(tmp_path).Scalars("loss")
    assert (event.step, event.value) == (7, pytest.approx(float(value)))


def test_tags_steps_values_and_walltime(tmp_path):
    writer = SummaryWriter(str(tmp_path), flush_secs=1, max_queue=2)
    for step in range(1, 6):
        writer.add_scalars({"loss": 1.0 / step, "train/acc": step / 10}, step, walltime=1000.0 + step)
    writer.add_scalar("global_step/sec", 12.5, 5)
    writer.close()
    events = accumulate(tmp_path)
    assert sorted(events.Tags()["scalars"]) == ["global_step/sec", "loss", "train/acc"]
    assert [(e.step, e.value) for e in events.Scalars("train/acc")] == [(s, pytest.approx(s / 10)) for s in range(1, 6)]
    assert [e.wall_time for e in events.Scalars("loss")] == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    assert events.Scalars("global_step/sec")[0].value == 12.5


def test_session_logs(tmp_path):
    with SummaryWriter(str(tmp_path)) as writer:
        writer.add_session_log("START", 0)
        writer.add_session_log("CHECKPOINT", 100, checkpoint_path=str(tmp_path / "model.ckpt-100"), msg="saved")
        writer.add_session_log("STOP", 120)
    assert session_logs(str(tmp_path)) == [
        ("START", 0, "", ""),
        ("CHECKPOINT", 100, str(tmp_path / "model.ckpt-100"), "saved"),
        ("STOP", 120, "", ""),
    ]


def test_start_on_resume_drops_the_crashed_runs_later_events(tmp_path):
    with SummaryWriter(str(tmp_path)) as crashed:
        for step in (10, 20, 30):
            crashed.add_scalar("loss", step, step)
    with SummaryWriter(str(tmp_path)) as resumed:  # resumed from the checkpoint of step 20
        resumed.add_session_log("START", 21)
        resumed.add_scalar("loss", -30, 30)
    assert [(e.step, e.value) for e in accumulate(tmp_path).Scalars("loss")] == [(10, 10), (20, 20), (30, -30)]


def test_filename_suffix_and_logdir(tmp_path):
    writer = SummaryWriter(tmp_path / "sub", filename_suffix=".trainer")
    assert writer.logdir == str(tmp_path / "sub")
    writer.close()
    [name] = os.listdir(tmp_path / "sub")
    assert name.startswith("events.out.tfevents.") and name.endswith(".trainer")


def test_close_is_idempotent_and_final(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    writer.close()
    writer.close()
    writer.flush()  # nothing to flush: no error
    with pytest.raises(RuntimeError, match="is closed"):
        writer.add_scalar("loss", 1.0, 1)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda w: w.add_scalar("x", torch.ones(3), 1), TypeError, r"'x' needs a number or a 0-dim tensor.*shape \(3,\)"),
        (lambda w: w.add_scalar("", 1.0, 1), TypeError, "tag must be a non-empty string"),
        (lambda w: w.add_scalar("x", "high", 1), TypeError, "needs a number"),
        (lambda w: w.add_scalar("x", 1.0, 1.5), ValueError, "step must be an integer"),
        (lambda w: w.add_session_log("PAUSE", 1), ValueError, "status must be one of 'START', 'STOP', 'CHECKPOINT'"),
        (lambda w: w.add_session_log("STOP", 1, msg=3), TypeError, "msg must be a string"),
        (lambda w: w.add_scalars({"ok": 1.0, 7: 2.0}, 1), TypeError, "tag must be a non-empty string"),
    ],
)
def test_bad_values_are_refused(tmp_path, call, error, words):
    with SummaryWriter(str(tmp_path)) as writer:
        with pytest.raises(error, match=words):
            call(writer)
        writer.add_scalar("after", 1.0, 2)  # the refusal queued nothing and broke nothing
    assert [e.step for e in accumulate(tmp_path).Scalars("after")] == [2]
    assert accumulate(tmp_path).Tags()["scalars"] == ["after"]


def test_a_value_is_read_when_it_is_added_not_when_its_event_is_written(tmp_path):
    # The events are built on the writer thread, later: what is written must be the value the
    # tensor had at add_scalar, although the training step changes it in place afterwards.
    loss = torch.tensor(0.5)
    with SummaryWriter(str(tmp_path), flush_secs=60) as writer:
        writer.add_scalar("loss", loss, 1, walltime=1000.0)
        loss.fill_(9.0)
        writer.add_scalars({"loss": loss}, 2)
        loss.fill_(-1.0)
        writer.add_session_log("CHECKPOINT", 2, checkpoint_path="/ckpt/model.ckpt-2", msg="m")
    events = accumulate(tmp_path).Scalars("loss")
    assert [(e.step, e.value) for e in events] == [(1, 0.5), (2, 9.0)]
    assert events[0].wall_time == 1000.0
    assert session_logs(tmp_path) == [("CHECKPOINT", 2, "/ckpt/model.ckpt-2", "m")]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [({"logdir": ""}, TypeError), ({"logdir": None}, TypeError), ({"flush_secs": 0}, ValueError),
     ({"max_queue": 0}, ValueError), ({"filename_suffix": 1}, TypeError)],
)
def test_bad_constructor_arguments(tmp_path, kwargs, error):
    arguments = {"logdir": str(tmp_path), **kwargs}
    logdir = arguments.pop("logdir")
    with pytest.raises(error, match=next(iter(kwargs))):
        SummaryWriter(logdir, **arguments)


def test_cache_shares_one_writer_per_logdir(tmp_path):
    first = SummaryWriterCache.get(str(tmp_path))
    assert SummaryWriterCache.get(str(tmp_path / "." )) is first
    assert SummaryWriterCache.get(str(tmp_path / "eval")) is not first
    first.add_scalar("loss", 1.0, 1)
    SummaryWriterCache.clear()
    assert first.closed
    assert accumulate(tmp_path).Scalars("loss")[0].value == 1.0
    assert SummaryWriterCache.get(str(tmp_path)) is not first


def test_cache_replaces_a_writer_someone_closed(tmp_path):
    first = SummaryWriterCache.get(str(tmp_path))
    first.close()
    assert not SummaryWriterCache.get(str(tmp_path)).closed


def test_the_in_memory_twin_has_the_same_interface():
    for name in ("add_scalar", "add_scalars", "add_session_log", "flush", "close"):
        real = inspect.signature(getattr(SummaryWriter, name))
        fake = inspect.signature(getattr(InMemorySummaryWriter, name))
        assert list(real.parameters) == list(fake.parameters), name
        assert [p.kind for p in real.parameters.values()] == [p.kind for p in fake.parameters.values()], name


def _scalars_on_disk(logdir):
    return [e.step for e in accumulate(logdir).Scalars("loss")] if "loss" in accumulate(logdir).Tags()["scalars"] else []


def test_events_are_written_in_batches_within_flush_secs_without_a_flush_call(tmp_path):
    import time

    writer = SummaryWriter(str(tmp_path), flush_secs=0.3, max_queue=1000)
    try:
        writer.add_scalar("loss", 1.0, 1)
        writer.add_scalar("loss", 2.0, 2)
        deadline = time.monotonic() + 10
        while _scalars_on_disk(tmp_path) != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _scalars_on_disk(tmp_path) == [1, 2]  # the writer thread wrote and flushed both
    finally:
        writer.close()


def test_max_queue_events_wake_the_writer_before_flush_secs(tmp_path):
    import time

    writer = SummaryWriter(str(tmp_path), flush_secs=3600, max_queue=3)
    try:
        for step in (1, 2):
            writer.add_scalar("loss", float(step), step)
        time.sleep(0.3)
        assert _scalars_on_disk(tmp_path) == []  # fewer than max_queue, an hour to go: still queued
        writer.add_scalar("loss", 3.0, 3)
        deadline = time.monotonic() + 10
        while _scalars_on_disk(tmp_path) != [1, 2, 3] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _scalars_on_disk(tmp_path) == [1, 2, 3]
    finally:
        writer.close()


def test_the_events_file_is_tensorboards_format_record_by_record(tmp_path):
    """TFRecord framing with both masked CRC-32Cs right; TensorBoard's own loader reads it."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    writer = SummaryWriter(str(tmp_path))
    for step in range(25):  # past max_queue: several batches
        writer.add_scalar("loss", float(step), step)
    writer.add_session_log("STOP", 25)
    writer.close()
    [path] = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    with open(path, "rb") as f:
        data, records = f.read(), 0
    while data:
        header, (header_crc,) = data[:8], struct.unpack("<I", data[8:12])
        (length,) = struct.unpack("<Q", header)
        body, (body_crc,) = data[12:12 + length], struct.unpack("<I", data[12 + length:16 + length])
        assert header_crc == masked_crc32c(header) and body_crc == masked_crc32c(body)
        data, records = data[16 + length:], records + 1
    assert records == 27
    events = list(LegacyEventFileLoader(path).Load())
    assert events[0].file_version == "brain.Event:2"
    assert [e.step for e in events[1:]] == list(range(26))
