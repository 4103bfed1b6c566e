"""``checkpoint_format=`` at the front doors (issue 32): any registered format the checkpoint
manager writes (``"safetensors"`` here) is accepted by `MonitoredTrainingSession` and `Supervisor`,
saves and resumes bit-exact (model, optimizer, data position, every RNG), and the CLI and the
sidecar evaluator read what it wrote; an unregistered name is refused at construction, naming the
argument, the value, the registered names and how to register one."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from hooks import StopAtStepHook
from supervisor import LoopState, MonitoredTrainingSession, Supervisor
from supervisor.checkpoint.layout import format_registry
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, register_format
from supervisor.estimator.sidecar import SidecarEvaluator
from tests.cli.helpers import cli, cli_json

pytest.importorskip("safetensors")
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader", exc_type=ImportError,
                                          reason="torchdata (the data extra) is not installed")
pytestmark = [pytest.mark.timeout(180), pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")]

QUIET = dict(save_checkpoint_secs=None, save_checkpoint_steps=None, save_summaries_steps=None,
             save_summaries_secs=None, log_step_count_steps=None, handle_signals=False)


def _objects(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(7)
    data = torch.arange(160.0).reshape(40, 4) / 160  # the same in every process
    loader = stateful_dataloader.StatefulDataLoader(data, batch_size=4, shuffle=True, generator=g)
    return model, opt, loader, LoopState(epoch=0, best=float("inf"), hidden=None, window=(0.5, 2))


def _run(logdir, last_step, objects, save_at=None, **kwargs):
    """Trains to ``last_step`` (one step per batch, epochs repeated); returns what each step drew
    from every generator (its batch, dropout's torch RNG, Python's and NumPy's)."""
    model, opt, loader, loop = objects
    seen = []
    with MonitoredTrainingSession(str(logdir), model, opt, state={"data": loader, "loop": loop},
                                  checkpoint_format="safetensors",
                                  hooks=[StopAtStepHook(last_step=last_step)], **QUIET, **kwargs) as s:
        while not s.should_stop():
            for batch in loader:
                if s.should_stop():
                    break

                def step():
                    opt.zero_grad()
                    loss = model(batch).sum()
                    loss.backward()
                    opt.step()
                    loop.epoch, loop.best = loop.epoch + 1, min(loop.best, loss.item())
                    return batch.sum().item(), torch.rand(1).item(), random.random(), float(np.random.rand())
                seen.append(s.run(step))
                if s.global_step == save_at:
                    s.save_checkpoint(wait=True)
    return seen


def _same(a, b):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_monitored_training_session_saves_safetensors_and_resumes_bit_exact(tmp_path):
    random.seed(1), np.random.seed(1)
    reference = _objects()
    expected = _run(tmp_path / "ref", 17, reference)
    random.seed(1), np.random.seed(1)
    _run(tmp_path / "run", 13, _objects(), save_at=13)
    assert sorted(os.listdir(tmp_path / "run" / "model.ckpt-13")) == ["MANIFEST.json", "state.safetensors"]

    random.seed(99), np.random.seed(99)  # other states everywhere: the restore brings the saved ones back
    resumed = _objects(seed=5)
    assert _run(tmp_path / "run", 17, resumed) == expected[13:]
    _same(resumed[0].state_dict(), reference[0].state_dict())
    _same(resumed[1].state_dict(), reference[1].state_dict())
    _same(resumed[3].state_dict(), reference[3].state_dict())  # the loop's plain values, a tuple too


def test_supervisor_saves_safetensors_the_cli_reads_it_and_resumes(tmp_path):
    model, opt, *_ = _objects()
    sv = Supervisor(str(tmp_path), model, opt, checkpoint_format="safetensors", save_model_secs=0,
                    save_summaries_secs=0, handle_signals=False)
    with sv.managed_session() as s:
        for _ in range(3):
            s.run(lambda: (opt.zero_grad(), model(torch.randn(2, 4)).sum().backward(), opt.step()))
    assert sorted(os.listdir(tmp_path / "model.ckpt-3")) == ["MANIFEST.json", "state.safetensors"]

    result, rows = cli_json("ls", tmp_path)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["verified"]) for r in rows] == [(3, True)]
    assert cli("verify", tmp_path / "model.ckpt-3").returncode == 0
    result, obj = cli_json("inspect", tmp_path)
    assert result.returncode == 0, result.stderr
    assert {v["name"]: v["shape"] for v in obj["variables"]}["model/0.weight"] == [8, 4]

    model2, opt2, *_ = _objects(seed=3)
    sv = Supervisor(str(tmp_path), model2, opt2, checkpoint_format="safetensors", save_model_secs=0,
                    save_summaries_secs=0, handle_signals=False)
    with sv.managed_session() as s:
        assert s.global_step == 3
        _same(model2.state_dict(), model.state_dict())
        _same(opt2.state_dict(), opt.state_dict())
        s.request_stop()

    model3, opt3, *_ = _objects(seed=4)  # a worker restores the chief's safetensors checkpoint, read-only
    with MonitoredTrainingSession(str(tmp_path), model3, opt3, is_chief=False, checkpoint_format="safetensors",
                                  max_wait_secs=30, handle_signals=False) as s:
        assert s.global_step == 3 and not s.is_chief
        _same(model3.state_dict(), model.state_dict())


def test_the_sidecar_evaluator_reads_a_safetensors_run(tmp_path):
    objects = _objects()
    _run(tmp_path, 4, objects, save_at=4)
    seen = {}

    def eval_step(evaluated, batch):
        seen.update({k: v.clone() for k, v in evaluated.state_dict().items()})
        return {"loss": evaluated(batch).sum()}

    evaluator = SidecarEvaluator(_objects(seed=2)[0], [torch.ones(2, 4)], str(tmp_path), eval_step=eval_step,
                                 max_evaluations=1, timeout=30, poll_secs=0.05)
    assert [r.step for r in evaluator.start()] == [4]
    _same(seen, objects[0].state_dict())


def _read_only(*args):
    raise AssertionError("never read here")


@pytest.mark.parametrize("door", ["mts", "sv"])
def test_an_unregistered_or_unwritable_format_is_refused_at_construction(tmp_path, door, monkeypatch):
    def build(name):
        if door == "mts":
            return MonitoredTrainingSession(str(tmp_path / "run"), torch.nn.Linear(1, 1), checkpoint_format=name,
                                            **QUIET)
        return Supervisor(str(tmp_path / "run"), torch.nn.Linear(1, 1), checkpoint_format=name)

    with pytest.raises(ValueError) as info:
        build("npz")
    for part in ("checkpoint_format='npz'", "'torch'", "'dcp'", "'safetensors'", "register_format",
                 "torch_supervisor.checkpoint_formats"):
        assert part in str(info.value)
    format_registry.formats()  # the built-in ones, into the registry kept after the test
    monkeypatch.setattr(format_registry, "_FORMATS", dict(format_registry._FORMATS))
    register_format(CheckpointFormat(name="readonly", marker="weights.ro", description="a read-only format",
                                     read=_read_only))
    with pytest.raises(ValueError, match="checkpoint_format='readonly': .*cannot write a read-only format"):
        build("readonly")
    assert not (tmp_path / "run").exists() or not any(n.startswith("model.ckpt") for n in os.listdir(tmp_path / "run"))


def test_checkpoint_tiers_persist_safetensors_and_restore_it_from_the_persistent_tier(tmp_path):
    objects = _objects()
    model, opt = objects[:2]
    _run(tmp_path / "run", 4, objects, save_at=4, local_dir=str(tmp_path / "local"), persist_every_steps=2)
    assert sorted(os.listdir(tmp_path / "run" / "model.ckpt-4")) == ["MANIFEST.json", "state.safetensors"]
    resumed = _objects(seed=3)
    _run(tmp_path / "run", 4, resumed, local_dir=str(tmp_path / "wiped"), persist_every_steps=2)
    _same(resumed[0].state_dict(), model.state_dict())
    _same(resumed[1].state_dict(), opt.state_dict())
