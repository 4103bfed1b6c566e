"""Reading single values of a checkpoint without loading the whole state (TF's
``list_variables`` / ``load_variable``), for `Estimator.get_variable_names` / `get_variable_value`.

``state.pt`` is opened with ``torch.load(mmap=True, weights_only=True)``: the file is mapped,
not read, and only the bytes of the tensor asked for are touched. Names join the nested keys
with ``/``: ``global_step``, ``model/fc.weight``, ``optimizer/state/0/exp_avg``,
``optimizer/param_groups/0/lr``. The format's own records (``__meta__``, ``rng``) are not
variables.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from supervisor.checkpoint.format import META_KEY, RNG_KEY, STATE_FILE
from supervisor.errors import CheckpointNotFoundError

__all__ = ["variable_names", "variable_value"]

_MISSING = object()


def variable_names(checkpoint_path: str) -> list[str]:
    """Every variable name of the checkpoint, in the saved order."""
    names: list[str] = []
    _flatten("", _mapped_payload(checkpoint_path), names)
    return names


def variable_value(checkpoint_path: str, name: str) -> Any:
    """The value named ``name`` (a tensor is returned as an in-memory copy)."""
    node: Any = _mapped_payload(checkpoint_path)
    for part in name.split("/"):
        match = _child(node, part)
        if match is _MISSING:
            raise KeyError(f"{name!r} is not a variable of {checkpoint_path}; see get_variable_names()")
        node = match
    if isinstance(node, Mapping) or _is_group(node):
        raise KeyError(f"{name!r} names a group of variables, not one; see get_variable_names()")
    return node.clone() if isinstance(node, torch.Tensor) else node


def _mapped_payload(checkpoint_path: str) -> Mapping[str, Any]:
    state_file = os.path.join(checkpoint_path, STATE_FILE)
    if not os.path.isfile(state_file):
        raise CheckpointNotFoundError(f"{checkpoint_path} has no {STATE_FILE} (a sharded checkpoint?); "
                                      "read it with supervisor.load_checkpoint")
    payload = torch.load(state_file, map_location="cpu", mmap=True, weights_only=True)
    return {k: value for k, value in payload.items() if k not in (META_KEY, RNG_KEY)}


def _is_group(node: Any) -> bool:
    return isinstance(node, (list, tuple)) and any(isinstance(x, (Mapping, torch.Tensor)) for x in node)


def _child(node: Any, part: str) -> Any:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if str(key) == part:
                return value
    elif isinstance(node, (list, tuple)) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _MISSING


def _flatten(prefix: str, node: Any, out: list[str]) -> None:
    if isinstance(node, Mapping):
        for key, value in node.items():
            _flatten(f"{prefix}/{key}" if prefix else str(key), value, out)
    elif _is_group(node):
        for i, value in enumerate(node):
            _flatten(f"{prefix}/{i}", value, out)
    else:
        out.append(prefix)
