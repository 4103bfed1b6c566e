"""Eval events and the events reader on an object store (SPEC §10, §16), against a real moto
server: each evaluation is a new immutable object, `read_scalars` (what the early-stopping hooks,
the sidecar and ``train_and_evaluate`` read) reads the prefix, and the hooks' ``output_dir`` may
be an ``s3://`` URL configured the standard way (``AWS_ENDPOINT_URL_S3``)."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from hooks import StepCounterHook, SummarySaverHook, read_eval_metrics  # noqa: E402
from supervisor.events import EVENTS_PREFIX, EvalEventsFile, read_scalars  # noqa: E402
from supervisor.summary import SummaryWriterCache  # noqa: E402
from tests.hooks._helpers import run_steps  # noqa: E402
from tests.events.s3.conftest import cached_options as options  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def download(storage, url, directory):
    names = [n for n in storage.listdir(url) if n.startswith(EVENTS_PREFIX)]
    for name in names:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(storage.read_bytes(storage.join(url, name)))
    return names


def test_each_evaluation_is_a_new_object_read_back_in_order(s3_server, s3_storage, s3_root, tmp_path):
    url = s3_root + "/model/eval"
    opts = options(s3_server.endpoint)
    events = EvalEventsFile(url, opts)
    for step, loss in ((100, 0.5), (200, 0.25), (300, 0.125)):
        events.write({"loss": loss, "accuracy": 1 - loss}, step)
        assert s3_storage.exists(events.path)  # whole, the moment write returns
    assert read_scalars(url, opts) == {100: {"loss": 0.5, "accuracy": 0.5}, 200: {"loss": 0.25, "accuracy": 0.75},
                                       300: {"loss": 0.125, "accuracy": 0.875}}
    names = download(s3_storage, url, tmp_path)
    assert len(names) == 3 and all(n.endswith(".eval") for n in names)
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("loss")] == [(100, 0.5), (200, 0.25), (300, 0.125)]


def test_the_reader_on_a_missing_prefix_and_on_what_is_not_an_events_object(s3_server, s3_storage, s3_root):
    opts = options(s3_server.endpoint)
    assert read_scalars(s3_root + "/nothing/here", opts) == {}
    url = s3_root + "/eval"
    EvalEventsFile(url, opts).write({"loss": 1.0}, 5)
    s3_storage.write_atomic(s3_storage.join(url, "notes.txt"), b"not events")
    s3_storage.write_atomic(s3_storage.join(url, EVENTS_PREFIX + "0.dir", "x"), b"a prefix named like one")
    s3_storage.write_atomic(s3_storage.join(url, EVENTS_PREFIX + "9.torn"), b"\x01\x02\x03")
    assert read_scalars(url + "/", opts) == {5: {"loss": 1.0}}


def test_a_failed_eval_write_names_the_object_and_the_step(s3_server):
    events = EvalEventsFile("s3://no-such-bucket-for-eval/eval", options(s3_server.endpoint))
    with pytest.raises(OSError, match=r"could not write the eval metrics of step 7 to "
                                      r"s3://no-such-bucket-for-eval/eval/events\.out\.tfevents\..*\.eval"):
        events.write({"loss": 1.0}, 7)


def test_hooks_write_to_an_s3_output_dir_configured_by_the_environment(s3_server, s3_root, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    url = s3_root + "/run"
    try:
        run_steps([SummarySaverHook(save_steps=5, output_dir=url), StepCounterHook(every_n_steps=5, output_dir=url)],
                  12)
    finally:
        SummaryWriterCache.clear()
    written = read_scalars(url)
    assert [step for step, tags in written.items() if "loss" in tags] == [1, 6, 11, 12]
    assert read_eval_metrics(url) == written  # the early-stopping hooks' reader
    accumulator = EventAccumulator(url)  # TensorBoard itself, on the URL (boto3 reads AWS_ENDPOINT_URL_S3)
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("loss")] == [1, 6, 11, 12]
