"""`NanTensorHook`: stop (or fail) when the loss becomes NaN or infinite."""
from __future__ import annotations

import logging
import math
from typing import Any, Callable

from supervisor.errors import NanLossDuringTrainingError
from supervisor.hook import Hook, RunArgs, RunContext, RunValues
from supervisor.toolkit import SINGLE_OUTPUT_KEY, check_bool, scalar_or_none

__all__ = ["NanTensorHook"]

logger = logging.getLogger(__name__)


class NanTensorHook(Hook):
    """Checks the loss after every step; a NaN **or infinite** loss fails or stops training.

    TF checked only NaN; an infinite loss diverges just the same and is caught here too. The
    check reads the value every step (on CUDA that is a device-to-host sync of one scalar).

    Args:
        loss_key: the step output to check: a key of the returned dict (a step function
            returning one value exposes it as ``"loss"``) or a zero-argument callable.
        fail_on_nan_loss: raise `supervisor.NanLossDuringTrainingError` (True) or log a
            WARNING and request a clean stop (False).
    """

    def __init__(self, loss_key: str | Callable[[], Any] = SINGLE_OUTPUT_KEY, *, fail_on_nan_loss: bool = True) -> None:
        if not ((isinstance(loss_key, str) and loss_key) or callable(loss_key)):
            raise TypeError(f"loss_key must be an output key (a non-empty str such as 'loss') or a zero-argument "
                            f"callable, got {loss_key!r}")
        self._fail = check_bool("fail_on_nan_loss", fail_on_nan_loss)
        self._run_args = RunArgs(fetches=loss_key)
        self._name = loss_key if isinstance(loss_key, str) else getattr(loss_key, "__name__", "loss")

    def before_run(self, run_context: RunContext) -> RunArgs:
        return self._run_args

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        value = run_values.results
        if _is_finite(value):
            return
        step = run_context.session.global_step
        message = f"Model diverged with {self._name} = {_describe(value)} at step {step}."
        if self._fail:
            # Raised, not also logged: the session re-raises it at close (logged once, by the caller).
            raise NanLossDuringTrainingError(message)
        logger.warning("%s Requesting a stop (fail_on_nan_loss=False).", message)
        run_context.request_stop()


def _is_finite(value: Any) -> bool:
    scalar = scalar_or_none(value)
    if scalar is not None:
        return math.isfinite(scalar)
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return bool(torch.isfinite(value).all())
        import numpy as np

        return bool(np.isfinite(np.asarray(value)).all())
    except TypeError:
        raise TypeError(f"NanTensorHook checks a number or a tensor, got {type(value).__name__}: {value!r}") from None


def _describe(value: Any) -> str:
    scalar = scalar_or_none(value)
    if scalar is not None:
        return "NaN" if math.isnan(scalar) else str(scalar)
    return "a tensor with NaN or inf entries"
