"""What counts as a scalar step output, decided once for summaries, hooks and the writer.

A scalar is a real number or anything 0-dimensional with ``.item()`` (a 0-dim tensor or NumPy
array, a NumPy scalar), as SPEC §6 says. Booleans count, as 0.0 and 1.0: a step that returns
``{"converged": loss < 0.01}`` draws a 0/1 curve. Complex values, strings and tensors with a
dimension (even of one element: reduce them, e.g. ``.squeeze()`` or ``.mean()``) are not.
"""
from __future__ import annotations

import logging
import numbers
from collections.abc import Mapping
from typing import Any

from supervisor.hook import SINGLE_OUTPUT_KEY

__all__ = ["describe_value", "scalar_or_none", "scalars_of"]

logger = logging.getLogger(__name__)

def scalar_or_none(value: Any, *, one_element: bool = False) -> float | None:
    """``value`` as a float if it is a scalar (see the module docstring), else None.

    ``one_element=True`` also takes a tensor/array of exactly one element: for an explicit
    ``add_scalar(tag, value)``, where the caller said the value is a scalar.

    ``.item()`` copies a CUDA value to the host: callers use it at summary time, not per step.

    Examples:
        >>> import torch
        >>> scalar_or_none(torch.tensor(0.25))
        0.25
        >>> scalar_or_none(torch.ones(3)) is None
        True
        >>> scalar_or_none(torch.ones(1), one_element=True)
        1.0
    """
    if type(value) is float:  # the common case first: a summary step runs from cold caches
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)
    if not callable(item) or (getattr(value, "ndim", None) != 0 and not (one_element and _size(value) == 1)):
        return None
    try:
        result = item()
    except (TypeError, ValueError, RuntimeError):
        return None
    return float(result) if isinstance(result, numbers.Real) else None


def _size(value: Any) -> int | None:
    numel = getattr(value, "numel", None)  # torch
    size = numel() if callable(numel) else getattr(value, "size", None)  # or NumPy
    return size if isinstance(size, int) else None


def describe_value(value: Any) -> str:
    """``a Tensor of shape (4,)`` / ``a str``: for messages about a value that is not a scalar.

    Examples:
        >>> import torch
        >>> describe_value(torch.ones(4))
        'a Tensor of shape (4,)'
    """
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    return f"a {kind} of shape {tuple(shape)}" if shape is not None else f"a {kind}"


def scalars_of(output: Any, warned: set[str] | None = None, owner: str = "summaries") -> dict[str, float]:
    """The scalars of a step's output: each scalar value of a returned dict under its key (a
    single returned value counts as ``"loss"``); None values are skipped.

    A value that is not a scalar is left out with a WARNING naming the key, once per key per
    ``warned`` set (the caller keeps one per summary writer it feeds).

    Examples:
        >>> import torch
        >>> scalars_of({"loss": torch.tensor(0.5), "logits": torch.ones(2, 3), "lr": 0.1}, warned=set())
        {'loss': 0.5, 'lr': 0.1}
        >>> scalars_of(torch.tensor(2.0))   # a single returned value is the loss
        {'loss': 2.0}
    """
    if output is None:
        return {}
    items = output.items() if isinstance(output, Mapping) else ((SINGLE_OUTPUT_KEY, output),)
    scalars: dict[str, float] = {}
    for key, value in items:
        scalar = scalar_or_none(value)
        if scalar is not None:
            scalars[str(key)] = scalar
        elif value is not None and warned is not None and str(key) not in warned:
            warned.add(str(key))
            logger.warning("%s: the step output %r is %s, not a number or a 0-dim tensor, so it is "
                           "not written to TensorBoard; reduce it (e.g. .mean()) or leave it out of the "
                           "dict the step returns", owner, str(key), describe_value(value))
    return scalars
