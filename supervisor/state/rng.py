"""Random-number-generator state: capture and restore (SPEC §2).

A resumed run must draw the same random numbers an uninterrupted run would have drawn
(dropout masks, data shuffling, augmentation), so every checkpoint carries the state of
Python's `random`, NumPy's global generator, torch's CPU generator and every CUDA device's
generator. The states are stored as tensors, ints, floats, strings and lists only — never
pickled generator objects — so a checkpoint still loads with ``torch.load(weights_only=True)``.

Checkpoints keep one state per rank (``{"rng": {rank: state}}``) so that distributed runs can
give each rank its own stream back (§12); a single process is rank 0.

Besides the global generators, a state may hold named ``torch.Generator`` objects the training
state owns (``"generators": {name: state}``), e.g. a ``StatefulDataLoader``'s ``generator=``;
`supervisor.state.resume` names them and decides when to restore them (optional key: checkpoints
without it still load, in the same format version).

Example::

    state = capture_rng_state()
    a = torch.rand(3)
    restore_rng_state(state)
    assert torch.equal(torch.rand(3), a)
"""
from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from supervisor.errors import CheckpointError

__all__ = ["capture_rng_state", "restore_rng_state", "RNG_FORMAT_VERSION"]

logger = logging.getLogger(__name__)

#: Bumped when the layout of a captured state changes; restore refuses unknown versions.
RNG_FORMAT_VERSION = 1


def capture_rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Returns the state of every global generator of this process, and of each of the named
    ``generators`` (under ``"generators"``), in a ``weights_only``-safe form."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "version": RNG_FORMAT_VERSION,
        "python": {
            "version": int(version),
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
        "numpy": {
            "kind": str(kind),
            # uint32 keys widened to int64: torch's uint32 support is partial.
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    # Only touch CUDA when it is in use: querying it would initialise a context for nothing.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    if generators:
        state["generators"] = {name: g.get_state() for name, g in generators.items()}
    return state


def restore_rng_state(state: Any, *, where: str = "checkpoint",
                      generators: Mapping[str, torch.Generator] | None = None) -> list[str]:
    """Sets every global generator, and each of the named ``generators`` the state holds, from a
    state `capture_rng_state` returned; returns the names in ``generators`` it holds no state for.

    Raises:
        CheckpointError: the state is malformed or of an unknown version (``where`` names the
            checkpoint in the message).
    """
    try:
        return _restore(state, generators or {})
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise CheckpointError(f"the RNG state stored in {where} cannot be restored: {e}") from e


def _restore(state: Any, generators: Mapping[str, torch.Generator]) -> list[str]:
    if not isinstance(state, dict):
        raise TypeError(f"expected a dict, got {type(state).__name__}")
    if state.get("version") != RNG_FORMAT_VERSION:
        raise ValueError(f"unknown RNG format version {state.get('version')!r} "
                         f"(this torch-supervisor reads version {RNG_FORMAT_VERSION})")
    py = state["python"]
    internal = tuple(int(x) for x in py["state"].tolist())
    np_state = state["numpy"]
    keys = np_state["keys"].numpy().astype(np.uint32)
    # Validate everything before setting anything, so a bad state changes no generator.
    cpu = state["torch"]
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8:
        raise TypeError("the torch CPU state must be a uint8 tensor")
    saved = state.get("generators") or {}
    if not isinstance(saved, Mapping):
        raise TypeError(f"'generators' must be a dict of name -> state, got {type(saved).__name__}")
    for name in generators:
        if name in saved and not (isinstance(saved[name], torch.Tensor) and saved[name].dtype == torch.uint8):
            raise TypeError(f"the state of the generator {name!r} must be a uint8 tensor")
    random.setstate((int(py["version"]), internal, py["gauss_next"]))
    np.random.set_state((np_state["kind"], keys, int(np_state["pos"]),
                         int(np_state["has_gauss"]), float(np_state["cached_gaussian"])))
    torch.set_rng_state(cpu)
    cuda = state.get("cuda")
    if cuda:
        _restore_cuda(cuda)
    for name, generator in generators.items():
        if name in saved:
            generator.set_state(saved[name])
    return [name for name in generators if name not in saved]


def _restore_cuda(states: list[torch.Tensor]) -> None:
    if not torch.cuda.is_available():
        logger.warning("the checkpoint holds the RNG state of %d CUDA device(s) but CUDA is not "
                       "available; the CUDA generators are not restored", len(states))
        return
    count = torch.cuda.device_count()
    if count != len(states):
        logger.warning("the checkpoint holds the RNG state of %d CUDA device(s), this process sees "
                       "%d; restoring the first %d", len(states), count, min(count, len(states)))
    for device, device_state in enumerate(states[:count]):
        torch.cuda.set_rng_state(device_state, device)
