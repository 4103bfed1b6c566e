"""`Estimator.get_variable_names` / `get_variable_value`: TF's names and values of a checkpoint,
read through `supervisor.checkpoint.load.variables` (the one naming rule: ``global_step``,
``model/fc.weight``, ``optimizer/state/0/exp_avg``, ``optimizer/param_groups/0/lr``; see its
module docstring). ``state.pt`` is memory-mapped, so only the bytes of the value asked for are
read; sharded (``checkpoint_format="dcp"``) checkpoints are read through DCP's metadata.

The estimator lists the training state's variables: the per-rank RNG records (``rng/...``),
which the reader also lists, are not among them.
"""
from __future__ import annotations

import os
from typing import Any

from supervisor.checkpoint import RNG_KEY, SEPARATOR, CheckpointReader
from supervisor.checkpoint.storage import Location

__all__ = ["variable_names", "variable_value"]


def _is_variable(name: str) -> bool:
    return name != RNG_KEY and not name.startswith(RNG_KEY + SEPARATOR)


def variable_names(checkpoint_path: str | Location) -> list[str]:
    """Every variable name of the checkpoint (a path or URL, or its resolved `Location`: the
    estimator's storage), in the saved order."""
    with CheckpointReader(checkpoint_path) as reader:
        return [v.name for v in reader.variables() if _is_variable(v.name)]


def variable_value(checkpoint_path: str | Location, name: str) -> Any:
    """The value named ``name``: a tensor in memory (a number as a 0-dim tensor).

    Raises:
        KeyError: ``name`` is not a variable, or names a group of them (e.g. ``"model"``).
    """
    with CheckpointReader(checkpoint_path) as reader:
        if _is_variable(name) and reader.has_tensor(name):
            return reader.get_tensor(name)
        names = [v.name for v in reader.variables() if _is_variable(v.name)]
    if _is_variable(name) and any(n.startswith(name + SEPARATOR) for n in names):
        raise KeyError(f"{name!r} names a group of variables, not one; see get_variable_names()")
    raise KeyError(f"{name!r} is not a variable of {os.fspath(checkpoint_path)}; see get_variable_names()")
