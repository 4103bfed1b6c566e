"""`Supervisor` and `Estimator` on an ``s3://`` logdir (SPEC §16, issue 24 item 1) against a real
moto server: the managed session's summaries are events objects TensorBoard's own
`EventAccumulator` reads (downloaded into a local directory, as ``tensorboard --logdir`` on a
synced copy would), one curve per tag; a second Supervisor resumes from the checkpoint there."""
from __future__ import annotations

import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hooks import StopAtStepHook
from supervisor import Supervisor
from supervisor.estimator import Estimator, RunConfig
from supervisor.summary import SummaryWriterCache
from tests.s3_fixtures import options

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _clear_cache():
    yield
    SummaryWriterCache.clear()


def _train_to(url, opts, last_step):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.tensor([[1.0, -2.0, 0.5]])

    def step():
        opt.zero_grad()
        loss = (model(target) - 1.0).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    sv = Supervisor(url, model, opt, hooks=[StopAtStepHook(last_step=last_step)], save_model_secs=3600,
                    save_summaries_secs=3600, storage_options=opts)
    with sv.managed_session() as s:
        start = s.global_step
        while not s.should_stop():
            s.run(step)
            sv.summary_computed({"custom": float(s.global_step)})
    return start, model


def _download_events(storage, url, directory):
    names = [n for n in storage.listdir(url) if n.startswith("events.out.tfevents.")]
    for name in names:
        with open(os.path.join(directory, name), "wb") as f:
            f.write(storage.read_bytes(storage.join(url, name)))
    return names


def test_managed_session_on_s3_writes_events_tensorboard_reads(s3_server, s3_root, s3_storage, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    assert _train_to(url, opts, 6)[0] == 0
    start, _ = _train_to(url, opts, 9)
    assert start == 6  # resumed from the checkpoint on s3
    local = tmp_path / "events"
    local.mkdir()
    assert _download_events(s3_storage, url, local)
    acc = EventAccumulator(str(local))
    acc.Reload()
    assert [e.step for e in acc.Scalars("custom")] == list(range(1, 10))  # one curve, both runs, in order
    assert [e.value for e in acc.Scalars("custom")] == [float(i) for i in range(1, 10)]
    assert [e.step for e in acc.Scalars("loss")] == [6, 9]  # each run's final summary
    assert sorted(os.listdir(tmp_path)) == ["events"]  # nothing else written locally


def test_estimator_trains_on_s3_and_resumes(s3_server, s3_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/est", options(s3_server.endpoint)

    def make():
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train_step(batch):
            opt.zero_grad()
            loss = (model(batch) - 1).pow(2).mean()
            loss.backward()
            opt.step()
            return {"loss": loss.detach()}

        config = RunConfig(url, save_checkpoints_steps=2, storage_options=opts)
        return Estimator(model=model, optimizer=opt, train_step=train_step, config=config)

    def batches():
        while True:
            yield torch.ones(4, 2)

    est = make()
    est.train(batches, max_steps=4)
    assert est.latest_checkpoint() == url + "/model.ckpt-4"
    again = make()
    again.train(batches, max_steps=6)
    assert again.latest_checkpoint() == url + "/model.ckpt-6"
    assert torch.equal(again.model.weight, est.model.weight) is False  # two more steps were taken
    assert os.listdir(tmp_path) == []
