"""Loop variables as training state: the epoch, the best loss, the learning rate, a carried
hidden state — plain values checkpointed as they are.

An entry of the training state needs ``state_dict()``/``load_state_dict()``, and a plain
``int`` cannot be changed in place, so plain values go into one small mutable container with
attribute access, `LoopState`, which is an entry like any other::

    loop = LoopState(epoch=0, best_loss=float("inf"), lr=20.0, hidden=None)
    with MonitoredTrainingSession(logdir, model=model, optimizer=opt, state={"loop": loop}) as s:
        # restored: loop.epoch, loop.best_loss, ... are the values of the checkpoint
        while not s.should_stop():
            ...
            loop.epoch += 1

What it may hold is what ``torch.load(weights_only=True)`` loads without trusting anything:
``None``, ``bool``, ``int``, ``float``, ``str``, tensors, and lists, tuples and dicts (string
keys) of those. Anything else is refused when it is set (at construction or assignment), naming
the variable, so a checkpoint that could not be restored is never written.

Decisions: a variable the checkpoint lacks (added to the code after the checkpoint was written)
keeps the value it was created with, named in a WARNING; a variable the checkpoint has and the
container lacks is loaded too (nothing saved is dropped). Tensors are restored on the device of
the value they replace (a carried LSTM hidden state stays on the GPU), else on the CPU.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["LoopState"]

logger = logging.getLogger(__name__)

_SCALARS = (type(None), bool, int, float, str)
_RESERVED = frozenset({"state_dict", "load_state_dict", "as_dict"})


def _check_value(where: str, value: Any) -> None:
    if isinstance(value, _SCALARS) or isinstance(value, torch.Tensor):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(f"{where}[{i}]", item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the key {key!r} ({type(key).__name__}); LoopState dicts need str keys")
            _check_value(f"{where}[{key!r}]", item)
        return
    raise TypeError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which a checkpoint cannot hold as a "
        "plain value: LoopState holds None, bool, int, float, str, tensors, and lists/tuples/dicts of them. "
        "Put an object with state_dict()/load_state_dict() into state= as its own entry instead "
        "(or store what it needs, e.g. its state_dict(), in the LoopState)")


class LoopState:
    """A mutable set of plain values checkpointed with the training state (see the module).

    Args:
        **values: the variables and their initial values.

    Example::

        loop = LoopState(epoch=0, best_loss=float("inf"))
        sv = Supervisor(logdir, model=model, optimizer=opt, state={"loop": loop})
        loop.epoch += 1; loop["best_loss"] = 0.5    # attribute or item access
    """

    def __init__(self, **values: Any) -> None:
        object.__setattr__(self, "_values", {})
        for name, value in values.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in _RESERVED:
            raise AttributeError(f"LoopState variable names may not start with '_' or be one of "
                                 f"{sorted(_RESERVED)}, got {name!r}; rename it")
        _check_value(f"LoopState.{name}", value)
        self._values[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"LoopState has no variable {name!r} (it has {sorted(self._values)}); "
                                 f"create it first, e.g. LoopState({name}=...)") from None

    def __delattr__(self, name: str) -> None:
        try:
            del self._values[name]
        except KeyError:
            raise AttributeError(f"LoopState has no variable {name!r}") from None

    __getitem__ = __getattr__
    __setitem__ = __setattr__

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoopState) and self._values.keys() == other._values.keys() and all(
            _equal(self._values[k], other._values[k]) for k in self._values)

    __hash__ = None  # type: ignore[assignment]  (mutable)

    def __repr__(self) -> str:
        return "LoopState(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"

    def as_dict(self) -> dict[str, Any]:
        """A shallow copy of the variables as a dict."""
        return dict(self._values)

    def state_dict(self) -> dict[str, Any]:
        """The variables (live values: the checkpoint's capture copies them)."""
        return dict(self._values)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Sets every variable the checkpoint holds; the others keep their values (WARNING)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"LoopState.load_state_dict needs a mapping, got {type(state_dict).__name__}")
        kept = [name for name in self._values if name not in state_dict]
        if kept:
            logger.warning("LoopState: the checkpoint has no value for %s; keeping the initial value%s",
                           ", ".join(kept), "s" if len(kept) > 1 else "")
        for name, value in state_dict.items():
            setattr(self, name, _to_device(value, self._values.get(name)))


def _to_device(value: Any, current: Any) -> Any:
    """The loaded value with its tensors copied out of the checkpoint's buffers (a kept view
    would keep the whole loaded checkpoint in memory) onto the device of the value replaced."""
    if isinstance(value, torch.Tensor):
        device = current.device if isinstance(current, torch.Tensor) else value.device
        return value.to(device, copy=True)
    if isinstance(value, (list, tuple)):
        currents = current if isinstance(current, (list, tuple)) and len(current) == len(value) else [None] * len(value)
        return type(value)(_to_device(v, c) for v, c in zip(value, currents))
    if isinstance(value, dict):
        currents = current if isinstance(current, dict) else {}
        return {k: _to_device(v, currents.get(k)) for k, v in value.items()}
    return value


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b
