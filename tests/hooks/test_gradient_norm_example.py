"""The contributor exercise of a new hook (examples/gradient_norm_hook.py): one file importing
only public `supervisor` names, and this test of it in a real session."""
from __future__ import annotations

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from examples.gradient_norm_hook import GradientNormHook
from supervisor import MonitoredSession


def _train(hook, model, lr_at):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    with MonitoredSession(hooks=[hook]) as s:
        while not s.should_stop() and s.global_step < 50:
            def step():
                opt.zero_grad()
                scale = lr_at(s.global_step)
                torch.nn.functional.mse_loss(model(x) * scale, y).backward()
                opt.step()
            s.run(step)
        return s.global_step


def test_norms_are_written_every_n_steps_and_an_explosion_stops(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    hook = GradientNormHook(model, every_n_steps=5, max_norm=1e3, output_dir=str(tmp_path))
    # the loss is scaled by 1e6 from step 12: its gradients explode; the check at step 15 stops
    assert _train(hook, model, lambda step: 1e6 if step >= 12 else 1.0) == 15
    acc = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars("gradient_norm")
    assert [e.step for e in events] == [5, 10, 15]
    assert events[0].value < 1e3 < events[-1].value


def test_arguments_are_checked_at_construction():
    with pytest.raises(ValueError, match="every_n_steps"):
        GradientNormHook(torch.nn.Linear(2, 1), every_n_steps=0)
    with pytest.raises(ValueError, match="max_norm"):
        GradientNormHook(torch.nn.Linear(2, 1), max_norm=-1)
    with pytest.raises(ValueError, match="no parameters"):
        GradientNormHook([])
