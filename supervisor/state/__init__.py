"""The training state: a mapping ``name -> stateful object`` (SPEC §2).

A stateful object has ``state_dict()`` and ``load_state_dict(sd)``: modules, optimizers, LR
schedulers, ``GradScaler``, torchdata's ``StatefulDataLoader``, or user objects. ``model=`` and
``optimizer=`` are shorthands for the names ``"model"`` and ``"optimizer"``; ``state={...}`` adds
more. The global step and the RNG states are not entries: the session owns them and the
checkpoint format stores them beside the entries.

The package (issue 32) also holds what makes a restore of the state exact: `rng` (each
generator's state), `resume` (data loaders' generators, primed on a restore) and `loop_state`
(`LoopState`, plain loop variables as an entry). It imports nothing of ours but `supervisor.errors`:
`checkpoint/` and `distributed/` stand on it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Iterator

import torch

from supervisor.errors import CheckpointError

__all__ = ["TrainingState", "RESERVED_NAMES", "unwrap_module", "strip_wrapper_prefixes"]

# What wrappers put in front of the wrapped module's keys: DDP / DataParallel and torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")

# An optional entry (a summary sink's run id): its object has ``optional_entry = True`` and its
# saved state dict this key, so a checkpoint without it restores into a state with it (the
# object keeps its own state) and one with it into a state without it (ignored).
OPTIONAL_MARK = "__optional_entry__"

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

    @property
    def objects(self) -> Mapping[str, Any]:
        """A read-only live view of the entries (``name -> stateful object``)."""
        return MappingProxyType(self._objects)

    def as_dict(self) -> dict[str, Any]:
        """The dict of entries this state holds (not a copy: changing it changes the state)."""
        return self._objects

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
        _check_model_and_optimizer(model, optimizer, objects)
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

    def state_dict(self) -> dict[str, Any]:
        """Returns ``{name: obj.state_dict()}``, wrapped modules under their unwrapped keys.

        The values are the objects' own state dicts (live tensors, not copies); the checkpoint
        engine copies them into its staging buffers.
        """
        return {name: unwrap_module(obj).state_dict() for name, obj in self._objects.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Loads ``{name: sd}`` into the entries; the reserved names of the checkpoint format
        (``global_step``, ``rng``, ``__meta__``) are ignored, so a whole checkpoint can be passed.

        Modules load into the module inside any wrapper; a state dict that still carries a
        wrapper's ``module.`` / ``_orig_mod.`` prefix (e.g. saved by hand from a DDP model) has
        it stripped. With ``strict=True`` (the default) the entry names must match exactly and
        modules load strictly.

        Raises:
            CheckpointError: names missing or unexpected entries, or the entry that failed.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping of entry name -> state dict, got {type(state_dict).__name__}")
        missing = [n for n, obj in self._objects.items() if n not in state_dict and not _optional(obj)]
        unexpected = [n for n in state_dict if n not in self._objects and n not in RESERVED_NAMES
                      and not (isinstance(state_dict[n], Mapping) and state_dict[n].get(OPTIONAL_MARK))]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append(f"missing entries {missing} (in the training state, not in the checkpoint)")
            if unexpected:
                parts.append(f"unexpected entries {unexpected} (in the checkpoint, not in the training state)")
            raise CheckpointError("the checkpoint does not match the training state: " + "; ".join(parts)
                                  + f". {_MISMATCH_FIX}")
        saved_classes = _saved_classes(state_dict)
        for name, obj in self._objects.items():
            if name in state_dict:
                _check_optimizer(name, unwrap_module(obj), state_dict[name], saved_classes.get(name))
                _load_entry(name, unwrap_module(obj), state_dict[name], strict)

    def entry_classes(self) -> dict[str, str]:
        """``{name: "module.QualName"}`` of each entry's class (the module inside a wrapper):
        recorded in a checkpoint's metadata so a resume into another optimizer class is named
        at the restore, not found by a ``KeyError`` at the first step."""
        return {name: class_name(unwrap_module(obj)) for name, obj in self._objects.items()}


# What a front door's user does about a checkpoint whose entries differ from the training state.
_MISMATCH_FIX = ("To continue this run, build the training state the run that wrote the checkpoint had "
                 "(the same model=, optimizer= and state= entries); to start a different setup from its "
                 "weights, use a new logdir and warm-start with supervisor.restore_partial(<checkpoint>, "
                 "model) in init_fn (TrainingState.load_state_dict(..., strict=False) when loading by hand)")


def class_name(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _saved_classes(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = state_dict.get("__meta__")
    classes = meta.get("classes") if isinstance(meta, Mapping) else None
    return classes if isinstance(classes, Mapping) else {}  # absent in checkpoints before issue 22.17


def _check_optimizer(name: str, obj: Any, entry: Any, saved_class: Any) -> None:
    """An optimizer's state loads only into its own class: ``load_state_dict`` accepts another
    class's state and keeps its hyperparameters, and the first ``step()`` then fails (SGD:
    ``KeyError: 'momentum'``) or silently runs the other algorithm's settings."""
    if not isinstance(obj, torch.optim.Optimizer) or not isinstance(entry, Mapping):
        return
    current = class_name(obj)
    if isinstance(saved_class, str):
        if saved_class == current:
            return
        why = f"was saved by {saved_class}, the training state's is {current}"
    else:  # an older checkpoint: its param_groups tell whether this class can use them
        groups = entry.get("param_groups")
        if not (isinstance(groups, list) and groups and isinstance(groups[0], Mapping) and obj.param_groups):
            return
        lacking = sorted(set(obj.param_groups[0]) - set(groups[0]) - {"params"})
        if not lacking:
            return
        why = (f"was saved by another optimizer class than the training state's {current}: its "
               f"param_groups lack {', '.join(map(repr, lacking))}")
    raise CheckpointError(
        f"the checkpoint's entry {name!r} {why}. An optimizer's state loads only into its own class "
        "(the first step would fail or run the other algorithm's settings). To continue this run, "
        "use the optimizer class it was trained with; to switch optimizers, use a new logdir and "
        "warm-start the model with supervisor.restore_partial(<checkpoint>, model) in init_fn")


def _optional(obj: Any) -> bool:
    return getattr(obj, "optional_entry", False) is True


def _check_model_and_optimizer(model: Any, optimizer: Any, objects: Mapping[str, Any]) -> None:
    """Refuses the mix-ups that train silently, the model never changing (issue 34): ``model=`` an
    optimizer, ``optimizer=`` a module (or both, swapped), and an optimizer none of whose
    parameters is a parameter or buffer of a module of the state (``model=`` or ``state=``): built
    over another model, or over the model before a wrapper replaced its parameters. An optimizer
    over part of the model, or over it and extra tensors, is fine."""
    optimizer_class, module_class = torch.optim.Optimizer, torch.nn.Module
    if isinstance(model, optimizer_class) and isinstance(optimizer, module_class):
        raise TypeError(f"model= and optimizer= are swapped: model= is the optimizer {type(model).__name__} and "
                        f"optimizer= the module {type(optimizer).__name__}; pass model=<the module>, "
                        "optimizer=<the optimizer>")
    if isinstance(model, optimizer_class):
        raise TypeError(f"model= is an optimizer ({type(model).__name__}), not the module it trains; pass the "
                        "module as model= and the optimizer as optimizer=")
    if isinstance(optimizer, module_class):
        raise TypeError(f"optimizer= is a module ({type(optimizer).__name__}), not an optimizer; pass the module as "
                        "model= and its optimizer as optimizer=, e.g. torch.optim.SGD(model.parameters(), lr=0.1)")
    if not isinstance(model, module_class) or not isinstance(optimizer, optimizer_class):
        return
    owned = {id(t) for obj in objects.values() if isinstance(obj, module_class)
             for t in (*obj.parameters(), *obj.buffers())}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if params and not any(id(p) in owned for p in params):
        raise ValueError(
            f"none of the optimizer's {len(params)} parameters is a parameter of model= ({type(model).__name__}) or "
            f"of a module in state=, so training would never change the model: build the optimizer over "
            "model.parameters() (after wrapping the model: DDP, FSDP and parallelize_module replace parameters); "
            "if it trains another module, pass that module in state= too")


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
    if isinstance(obj, type):
        raise TypeError(f"{argument} is the class {obj.__module__}.{obj.__qualname__}, not an instance; "
                        f"create one, e.g. {argument}={obj.__qualname__}(...)")
    if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
        if isinstance(obj, (bool, int, float, str, list, tuple, dict, torch.Tensor, type(None))):
            raise TypeError(
                f"{argument} is a plain value ({type(obj).__name__} {_short(obj)}) without state_dict() and "
                f"load_state_dict(sd), so it cannot be restored in place; put loop variables in a "
                f"supervisor.LoopState, which is checkpointed: e.g. "
                f"state={{'loop': LoopState({name}={_short(obj)})}}, then read and set loop.{name}")
        raise TypeError(
            f"{argument} must have state_dict() and load_state_dict(sd) methods to be checkpointed, "
            f"got {type(obj).__name__}; wrap it in an object that provides them"
        )


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 40 else text[:37] + "..."


def unwrap_module(obj: Any) -> Any:
    """Returns the module inside DDP / DataParallel / ``torch.compile`` wrappers (any nesting);
    any other object is returned as it is."""
    wrappers = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while isinstance(obj, torch.nn.Module):
        if isinstance(obj, wrappers):
            obj = obj.module
        elif isinstance(getattr(obj, "_orig_mod", None), torch.nn.Module):
            obj = obj._orig_mod
        else:
            break
    return obj


def strip_wrapper_prefixes(state_dict: Mapping[str, Any], expected_keys: Any = ()) -> Mapping[str, Any]:
    """Strips ``module.`` / ``_orig_mod.`` prefixes that every key carries and the target's keys
    do not (``expected_keys``), repeatedly; returns ``state_dict`` itself when nothing is stripped.

    A module whose own first child is named ``module`` keeps its keys: the prefix is stripped only
    when the target's keys do not all carry it too.
    """
    expected = list(expected_keys)
    result = state_dict
    changed = True
    while changed and result:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            keys = [k for k in result if isinstance(k, str)]
            if len(keys) == len(result) and all(k.startswith(prefix) for k in keys) and not (
                    expected and all(k.startswith(prefix) for k in expected)):
                result = _strip(result, prefix)
                changed = True
    return result


def _strip(state_dict: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    out: OrderedDict[str, Any] = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items())
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        # Module versions (e.g. BatchNorm's) are keyed by module path: strip those too.
        out._metadata = OrderedDict(  # type: ignore[attr-defined]
            (k[len(prefix):] if k.startswith(prefix) else ("" if k == prefix[:-1] else k), v)
            for k, v in metadata.items())
    return out


def _load_entry(name: str, obj: Any, entry: Any, strict: bool) -> None:
    try:
        if isinstance(obj, torch.nn.Module):
            entry = strip_wrapper_prefixes(entry, obj.state_dict().keys())
            obj.load_state_dict(entry, strict=strict)
        else:
            obj.load_state_dict(entry)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of a user object's load is reported with its name
        raise CheckpointError(f"loading the entry {name!r} ({type(obj).__name__}) failed: "
                              f"{type(e).__name__}: {e}") from e
