"""The training state: a mapping ``name -> stateful object`` (SPEC §2).

A stateful object has ``state_dict()`` and ``load_state_dict(sd)``: modules, optimizers, LR
schedulers, ``GradScaler``, torchdata's ``StatefulDataLoader``, or user objects. ``model=`` and
``optimizer=`` are shorthands for the names ``"model"`` and ``"optimizer"``; ``state={...}`` adds
more. The global step and the RNG states are not entries: the session owns them and the
checkpoint format stores them beside the entries.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

__all__ = ["TrainingState", "RESERVED_NAMES"]

# Names the checkpoint format uses for its own records next to the user's entries.
RESERVED_NAMES = frozenset({"global_step", "rng", "__meta__"})


class TrainingState(Mapping):
    """Named stateful objects, validated once at construction.

    Example::

        state = TrainingState.from_arguments(model=net, optimizer=opt,
                                             state={"scheduler": sched, "data": loader})
        state["model"] is net
    """

    def __init__(self, objects: Mapping[str, Any] | None = None) -> None:
        objects = dict(objects or {})
        for name, obj in objects.items():
            _check_entry(name, obj, argument=f"state[{name!r}]")
        self._objects = objects

    @classmethod
    def from_arguments(cls, model: Any = None, optimizer: Any = None, state: Mapping[str, Any] | None = None) -> TrainingState:
        """Builds the state from the front doors' ``model=``, ``optimizer=`` and ``state=``."""
        if state is not None and not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict of name -> object with state_dict()/load_state_dict(), got {state!r}")
        objects: dict[str, Any] = {}
        for name, obj in (("model", model), ("optimizer", optimizer)):
            if obj is None:
                continue
            if state is not None and name in state:
                raise ValueError(
                    f"{name}= and state[{name!r}] both name the entry {name!r}; pass it once, "
                    f"either as {name}= or inside state="
                )
            _check_entry(name, obj, argument=name)
            objects[name] = obj
        objects.update(state or {})
        return cls(objects)

    def __getitem__(self, name: str) -> Any:
        return self._objects[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._objects)

    def __len__(self) -> int:
        return len(self._objects)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={type(v).__name__}" for k, v in self._objects.items())
        return f"TrainingState({inner})"


def _check_entry(name: Any, obj: Any, *, argument: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"state names must be non-empty strings, got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(
            f"state name {name!r} is reserved for the checkpoint format "
            f"({', '.join(sorted(RESERVED_NAMES))}); rename the entry"
        )
    if "/" in name or name.startswith("."):
        raise ValueError(f"state name {name!r} may not contain '/' or start with '.'; rename the entry")
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        raise TypeError(
            f"{argument} must have state_dict() and load_state_dict(sd) methods to be checkpointed, "
            f"got {type(obj).__name__}; wrap it in an object that provides them"
        )
