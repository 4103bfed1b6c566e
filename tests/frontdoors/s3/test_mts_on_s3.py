"""`MonitoredTrainingSession` on an ``s3://`` logdir (SPEC §16, issue 24 item 1), against a real
moto server over HTTP with the real s3fs/botocore client: a run saves there and a new session
restores step, weights, optimizer state and RNG bit-exact; a trainer SIGKILLed while a save
uploads resumes from the last committed checkpoint and ends bit-identical to a run never killed.
"""
from __future__ import annotations

import os
import signal

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.checkpoint import latest_checkpoint
from tests import zygote
from tests.s3_fixtures import CREDENTIALS, options

pytestmark = pytest.mark.timeout(180)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _train(session, model, opt):
    while not session.should_stop():
        def step():
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        session.run(step)


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_saves_on_s3_and_a_new_session_restores_bit_exact(s3_server, s3_root, s3_storage, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url, opts = s3_root + "/run", options(s3_server.endpoint)
    model, opt = _build()
    with MonitoredTrainingSession(url, model, opt, save_checkpoint_steps=4, storage_options=opts,
                                  hooks=[StopAtStepHook(last_step=10)]) as s:
        _train(s, model, opt)
    rng_at_end = torch.get_rng_state()
    assert latest_checkpoint(url, storage_options=opts) == url + "/model.ckpt-10"
    names = s3_storage.listdir(url)
    assert {"model.ckpt-8", "model.ckpt-10", "checkpoint"} <= set(names)
    assert any(n.startswith("events.out.tfevents.") for n in names)  # the summaries, on s3 too
    assert os.listdir(tmp_path) == []  # nothing written locally

    torch.manual_seed(123)  # another RNG state: the restore must bring the saved one back
    model2, opt2 = _build()
    with MonitoredTrainingSession(url, model2, opt2, storage_options=opts, save_checkpoint_steps=None,
                                  save_checkpoint_secs=None) as s:
        assert s.global_step == 10
        assert torch.equal(torch.get_rng_state(), rng_at_end)
        _assert_same(model2.state_dict(), model.state_dict())
        _assert_same(opt2.state_dict(), opt.state_dict())


def _run_trainer(url, out, endpoint, *extra):
    env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": ROOT}
    return zygote.python([os.path.join(HERE, "trainer.py"), url, "15", out, *extra], env=env, timeout=120,
                         cwd=str(out.parent))


@pytest.mark.slow
def test_sigkill_during_a_save_resumes_from_the_last_commit_bit_identical(s3_server, s3_root, tmp_path):
    reference = _run_trainer(s3_root + "/straight", tmp_path / "straight.pt", s3_server.endpoint)
    assert reference.returncode == 0, reference.stderr[-3000:]

    url = s3_root + "/killed"
    killed = _run_trainer(url, tmp_path / "never.pt", s3_server.endpoint, "--kill-at", "8")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "restored 0" in killed.stdout
    committed = latest_checkpoint(url, storage_options=options(s3_server.endpoint))
    assert committed in (url + "/model.ckpt-6", url + "/model.ckpt-9")  # 9 only if its upload won the race

    # No wait for the killed writer's lease to expire: its pid no longer runs on this host, so the
    # next writer takes the lease over at once (lease.py), as a rerun on the same node does.
    resumed = _run_trainer(url, tmp_path / "resumed.pt", s3_server.endpoint)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"restored {committed.rsplit('-', 1)[1]}" in resumed.stdout
    assert "taking over the lease of" in resumed.stderr and "at once" in resumed.stderr, resumed.stderr[-3000:]
    _assert_same(torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "straight.pt"))
