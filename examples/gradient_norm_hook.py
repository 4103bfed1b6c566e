"""A hook written from outside the package, the way the built-ins are written: the gradients'
global L2 norm to TensorBoard every N steps, and a stop when it explodes.

Imports only ``supervisor`` and ``supervisor.toolkit`` (docs/development.md, "Contributor
exercises": one file and its test, tests/hooks/test_gradient_norm_example.py).

    from examples.gradient_norm_hook import GradientNormHook
    hook = GradientNormHook(model, every_n_steps=100, max_norm=1e3, output_dir="runs/x")
"""
from __future__ import annotations

import logging
import math
from typing import Any

import torch

from supervisor import Hook
from supervisor.toolkit import WriterSlot, check_int, check_number

logger = logging.getLogger(__name__)


class GradientNormHook(Hook):
    """Every ``every_n_steps`` steps, after the step: the global L2 norm of the gradients of
    ``model`` (a module or an iterable of parameters) written as the scalar ``gradient_norm``;
    a norm over ``max_norm``, NaN or infinite requests a clean stop (``max_norm=None``: only a
    NaN or infinite one). Parameters without a gradient are skipped."""

    def __init__(self, model: Any, every_n_steps: int = 100, max_norm: float | None = None, *,
                 summary_writer: Any = None, output_dir: str | None = None) -> None:
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        try:
            self._params = [p for p in params if isinstance(p, torch.Tensor)]
        except TypeError:
            raise TypeError(f"GradientNormHook(model=...): expected a torch.nn.Module or an iterable of parameters, "
                            f"got {type(model).__name__}") from None
        if not self._params:
            raise ValueError(f"GradientNormHook(model=...): {model!r} has no parameters to watch; pass the model")
        self.every_n_steps = check_int("every_n_steps", every_n_steps, minimum=1)
        self.max_norm = check_number("max_norm", max_norm, strictly_positive=True, allow_none=True)
        self._slot = WriterSlot("GradientNormHook", summary_writer, output_dir)

    def after_create_session(self, session, coord):
        self._slot.after_create_session(session)

    def after_run(self, run_context, run_values):
        step = run_context.session.global_step
        if step % self.every_n_steps:
            return
        grads = [p.grad.detach() for p in self._params if p.grad is not None]
        if not grads:
            return
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
        if self._slot.writer is not None:
            self._slot.writer.add_scalar("gradient_norm", norm, step=step)
        if not math.isfinite(norm) or (self.max_norm is not None and norm > self.max_norm):
            logger.warning("gradient norm %s at step %d (max_norm=%s): requesting a stop", norm, step, self.max_norm)
            run_context.request_stop()
