"""One scalar rule for step outputs (supervisor/_scalars.py), shared by the Supervisor's summary
service, SummarySaverHook, NanTensorHook and the summary writer: they agree, also on a 0-dim
bool tensor (four copies disagreed there)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hooks import NanTensorHook, SummarySaverHook
from supervisor._scalars import scalar_or_none, scalars_of
from supervisor.summary import _to_float
from supervisor.testing import InMemorySummaryWriter

from tests.hooks._helpers import run_steps


@pytest.mark.parametrize(("value", "expected"), [
    (0.5, 0.5), (3, 3.0), (True, 1.0), (np.float32(0.5), 0.5), (np.bool_(False), 0.0), (np.array(2.0), 2.0),
    (torch.tensor(0.5), 0.5), (torch.tensor(True), 1.0), (torch.tensor(7, dtype=torch.int64), 7.0),
    (torch.tensor([0.5]), None), (torch.ones(3), None), ("x", None), (None, None), (1j, None), ([1.0], None),
])
def test_scalar_or_none(value, expected):
    assert scalar_or_none(value) == expected


def test_explicit_add_scalar_also_takes_one_element():
    assert scalar_or_none(torch.tensor([0.5]), one_element=True) == 0.5
    assert scalar_or_none(torch.ones(2), one_element=True) is None


def test_every_user_agrees_on_a_zero_dim_bool_tensor():
    flag = torch.tensor(True)
    assert scalars_of({"done": flag}) == {"done": 1.0}  # the Supervisor's summary service
    assert _to_float("done", flag) == 1.0  # SummaryWriter.add_scalar
    writer = InMemorySummaryWriter()
    run_steps([SummarySaverHook(save_steps=1, summary_writer=writer)], 1, step_fn=lambda: {"done": flag})
    assert [(e.tag, e.value) for e in writer.scalars] == [("done", 1.0)]
    run_steps([NanTensorHook("done")], 1, step_fn=lambda: {"done": flag})  # finite: no error
