"""Optimizer/model mix-ups are refused at construction (issue 34 item 10): they used to train
silently, the model never changing.

Refused: ``optimizer=`` a module, ``model=`` an optimizer (and both swapped), and an optimizer
none of whose parameters belongs to a module of the training state (``model=`` or a module in
``state=``): built over another model, or over the model before a wrapper replaced its
parameters. Accepted: an optimizer over part of the model, over the model and extra tensors,
over a second model kept in ``state=``, through a wrapper (DataParallel, torch.compile).
"""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from supervisor import MonitoredTrainingSession, SingularMonitoredSession, Supervisor, TrainingState
from supervisor.estimator import Estimator

pytestmark = pytest.mark.timeout(120)


def _dir(tmp_path):
    return str(tmp_path / "run")


DOORS = {
    "Supervisor": lambda d, **kw: Supervisor(d, **kw),
    "MonitoredTrainingSession": lambda d, **kw: MonitoredTrainingSession(d, **kw),
    "SingularMonitoredSession": lambda d, **kw: SingularMonitoredSession(d, **kw),
    "Estimator": lambda d, **kw: Estimator(d, **kw),
    "TrainingState.from_arguments": lambda d, **kw: TrainingState.from_arguments(**kw),
}


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def _sgd(module):
    return torch.optim.SGD(module.parameters(), lr=0.1)


def _other_model():
    model = _net()
    return dict(model=model, optimizer=_sgd(_net()))


def _optimizer_is_model():
    model = _net()
    return dict(model=model, optimizer=model)


def _swapped():
    model = _net()
    return dict(model=_sgd(model), optimizer=model)


def _model_is_optimizer():
    return dict(model=_sgd(_net()))


# (builder of the arguments, the exception, what the message must say)
MIXUPS = {
    "optimizer-over-another-model": (_other_model, ValueError,
                                     ["none of the optimizer's 4 parameters", "model", "model.parameters()"]),
    "optimizer-is-the-model": (_optimizer_is_model, TypeError, ["optimizer=", "Sequential", "a module",
                                                               "torch.optim.SGD(model.parameters()"]),
    "swapped": (_swapped, TypeError, ["swapped", "model=", "optimizer="]),
    "model-is-an-optimizer": (_model_is_optimizer, TypeError, ["model=", "SGD", "an optimizer", "optimizer="]),
}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("mixup", sorted(MIXUPS))
def test_a_mixup_is_refused_at_construction(door, mixup, tmp_path):
    build, error, needles = MIXUPS[mixup]
    with pytest.raises(error) as info:
        DOORS[door](_dir(tmp_path), **build())
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert not os.path.exists(_dir(tmp_path))


def _subset():
    model = _net()
    return dict(model=model, optimizer=torch.optim.SGD(model[0].parameters(), lr=0.1))


def _with_extra_tensor():
    model = _net()
    extra = torch.zeros(2, requires_grad=True)
    return dict(model=model, optimizer=torch.optim.SGD([*model.parameters(), extra], lr=0.1))


def _second_model_in_state():
    model, critic = _net(), _net()
    return dict(model=model, optimizer=_sgd(critic), state={"critic": critic})


def _shared_parameters():
    model = _net()
    head = nn.Linear(4, 1)
    head.weight = model[2].weight  # tied
    return dict(model=model, optimizer=torch.optim.SGD(head.parameters(), lr=0.1))


def _wrapped():
    model = nn.DataParallel(_net())
    return dict(model=model, optimizer=_sgd(model.module))


def _compiled():
    model = _net()
    return dict(model=torch.compile(model), optimizer=_sgd(model))


LEGITIMATE = {"subset": _subset, "extra-tensor": _with_extra_tensor, "second-model-in-state": _second_model_in_state,
              "shared-parameters": _shared_parameters, "wrapped": _wrapped, "compiled": _compiled}


@pytest.mark.parametrize("case", sorted(LEGITIMATE))
def test_legitimate_optimizers_are_accepted(case, tmp_path):
    arguments = LEGITIMATE[case]()
    TrainingState.from_arguments(**arguments)
    Supervisor(_dir(tmp_path), **arguments)


def test_a_refused_optimizer_trains_once_fixed(tmp_path):
    """What the message asks for (the optimizer over model.parameters()) trains the model."""
    model = _net()
    with pytest.raises(ValueError, match="model.parameters()"):
        Supervisor(_dir(tmp_path), model, _sgd(_net()))
    sv = Supervisor(_dir(tmp_path), model, _sgd(model), save_model_secs=0, save_summaries_secs=0)
    before = [p.detach().clone() for p in model.parameters()]
    with sv.managed_session() as session:
        loss = model(torch.ones(5, 3)).pow(2).mean()
        loss.backward()
        session.state["optimizer"].step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
