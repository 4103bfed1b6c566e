"""``capture="overlapped"`` through the front doors (SPEC §5.9): every checkpoint a session
commits is its state after that step, bit for bit, and a resumed run continues exactly."""
from __future__ import annotations

import os

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import Hook, MonitoredTrainingSession, SingularMonitoredSession, Supervisor, load_checkpoint

pytestmark = pytest.mark.timeout(120)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the real-stream variant needs torch.cuda.is_available()"))]


def make(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Dropout(0.3), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 1)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=0.02)


class RecordState(Hook):
    """Keeps a CPU copy of the state after every step (after every hook's after_run)."""

    def __init__(self):
        self.after = {}

    def after_run(self, run_context, run_values):
        session = run_context.session
        # Parameters and buffers only: the optimizer's state_dict() would wait for the copy.
        model = session.state["model"]
        self.after[session.global_step] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def make_step(model, optimizer, *, accumulate=1):
    device = next(model.parameters()).device
    calls = [0]

    def step():
        x = torch.randn(6, 5).to(device)  # the global RNG: exact resume restores it
        (model(x).pow(2).mean() / accumulate).backward()
        calls[0] += 1
        if calls[0] % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    return step


def run_mts(logdir, device, last_step, *, accumulate=1, record=None):
    model, optimizer = make(device)
    hooks = [StopAtStepHook(last_step=last_step)] + ([record] if record else [])
    with MonitoredTrainingSession(str(logdir), model, optimizer, hooks=hooks, save_checkpoint_steps=2,
                                  save_checkpoint_secs=None, save_summaries_steps=None, save_summaries_secs=None,
                                  log_step_count_steps=None, handle_signals=False, capture="overlapped") as s:
        step = make_step(model, optimizer, accumulate=accumulate)
        while not s.should_stop():
            s.run(step)
    return model, optimizer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("accumulate", [1, 3], ids=["every-step", "accumulate3"])
def test_mts_checkpoints_are_the_state_after_their_step_and_resume_is_exact(tmp_path, device, accumulate):
    record = RecordState()
    run_mts(tmp_path / "run", device, 6, accumulate=accumulate, record=record)
    for step in (2, 4, 6):
        saved = load_checkpoint(str(tmp_path / "run" / f"model.ckpt-{step}"))
        for name, tensor in record.after[step].items():
            assert torch.equal(saved["model"][name], tensor), (step, name)
    resumed, _ = run_mts(tmp_path / "run", device, 10, accumulate=accumulate)
    reference, _ = run_mts(tmp_path / "ref", device, 10, accumulate=accumulate)
    for (name, a), (_, b) in zip(resumed.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(a, b), name


def test_supervisor_and_singular_session_take_capture(tmp_path):
    model, optimizer = make("cpu")
    step = make_step(model, optimizer)
    sv = Supervisor(str(tmp_path / "sv"), model, optimizer, save_model_secs=0, save_summaries_secs=0,
                    handle_signals=False, capture="overlapped")
    with sv.managed_session() as s:
        s.run(step)
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        path = s.save_checkpoint()
        s.run(step)
    saved = load_checkpoint(path)
    assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())
    with SingularMonitoredSession(str(tmp_path / "single"), model, optimizer, capture="blocking",
                                  handle_signals=False, log_step_count_steps=None) as s:
        s.run(step)
    assert os.path.isdir(tmp_path / "single" / "model.ckpt-1")


@pytest.mark.parametrize("front_door", ["mts", "singular", "supervisor"])
def test_a_bad_capture_fails_at_construction_naming_it(tmp_path, front_door):
    build = {"mts": MonitoredTrainingSession, "singular": SingularMonitoredSession,
             "supervisor": Supervisor}[front_door]
    with pytest.raises(ValueError, match=r"capture must be one of 'auto', 'overlapped', 'blocking', got 'fast'"):
        build(str(tmp_path), capture="fast")

