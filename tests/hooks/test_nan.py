"""NanTensorHook: NaN and inf fail or stop; finite values pass."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from hooks import NanTensorHook
from supervisor import NanLossDuringTrainingError
from supervisor.testing import RecordingHook

from tests.hooks._helpers import run_steps

BAD = [
    pytest.param(math.nan, "NaN", id="float-nan"),
    pytest.param(math.inf, "inf", id="float-inf"),
    pytest.param(-math.inf, "-inf", id="float-minus-inf"),
    pytest.param(torch.tensor(float("nan")), "NaN", id="tensor-nan"),
    pytest.param(torch.tensor(float("inf")), "inf", id="tensor-inf"),
    pytest.param(torch.tensor([1.0, float("nan")]), "a tensor with NaN or inf entries", id="vector-nan"),
    pytest.param(np.float32("inf"), "inf", id="numpy-inf"),
]
GOOD = [0.5, 0, torch.tensor(1e30), torch.tensor([1.0, 2.0]), np.float64(-3.0)]


def diverging(bad_value, at_step=3):
    step = iter(range(1, 100))
    return lambda: {"loss": bad_value if next(step) == at_step else torch.tensor(0.5)}


@pytest.mark.parametrize(("bad", "shown"), BAD)
def test_fails_on_nan_or_inf(bad, shown):
    recorder = RecordingHook()
    with pytest.raises(NanLossDuringTrainingError, match=f"loss = {shown}.* at step 3"):
        run_steps([NanTensorHook(), recorder], 10, step_fn=diverging(bad))
    assert recorder.calls[-1] == "on_exception"


@pytest.mark.parametrize(("bad", "shown"), BAD)
def test_requests_a_stop_with_a_warning(bad, shown, caplog):
    session = run_steps([NanTensorHook(fail_on_nan_loss=False)], 10, step_fn=diverging(bad))
    assert session.global_step == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Model diverged" in warnings[0]


@pytest.mark.parametrize("good", GOOD)
def test_finite_values_pass(good):
    assert run_steps([NanTensorHook()], 5, step_fn=lambda: {"loss": good}).global_step == 5


def test_single_returned_value_is_the_loss():
    with pytest.raises(NanLossDuringTrainingError):
        run_steps([NanTensorHook()], 2, step_fn=lambda: torch.tensor(float("nan")))


def test_other_key_or_callable():
    with pytest.raises(NanLossDuringTrainingError, match="total"):
        run_steps([NanTensorHook("total")], 2, step_fn=lambda: {"total": math.nan, "loss": 0.0})
    with pytest.raises(NanLossDuringTrainingError):
        run_steps([NanTensorHook(lambda: math.inf)], 2)


def test_missing_key_names_the_keys():
    with pytest.raises(KeyError, match=r"NanTensorHook fetched 'loss'.*\['total'\]"):
        run_steps([NanTensorHook()], 1, step_fn=lambda: {"total": 1.0})
