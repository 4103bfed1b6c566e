"""What a pickle names, read statically: every global a checkpoint's ``data.pkl`` uses, and under
which top-level entry of its payload — nothing is imported or constructed (the unpickler's every
global is an inert recorder). `supervisor.checkpoint.formats.safe_globals` lists what a refused
checkpoint still needs with it."""
from __future__ import annotations

import _compat_pickle
import io
import pickle
from typing import Any, Iterable

import numpy as np

__all__ = ["global_name", "globals_by_entry", "pickle_bytes"]


def global_name(item: Any) -> str:
    """``module.qualname`` of an allowlist item (an object or an ``(object, name)`` pair)."""
    if isinstance(item, tuple):
        return item[1]
    return f"{getattr(item, '__module__', '?')}.{getattr(item, '__qualname__', getattr(item, '__name__', '?'))}"


def pickle_bytes(file_path: str) -> bytes:
    """The ``data.pkl`` record of the ``torch.save`` zip archive ``file_path`` (or an open file)."""
    import torch.serialization as ts

    if hasattr(file_path, "seek"):  # an in-memory file (check_loadable), read once already
        file_path.seek(0)  # type: ignore[attr-defined]
    # torch's own zip reader: checkpoints are written without per-record CRCs, which the
    # zipfile module would reject.
    with ts._open_file_like(file_path, "rb") as opened, ts._open_zipfile_reader(opened) as reader:
        return reader.get_record("data.pkl")


def globals_by_entry(data: bytes) -> Iterable[tuple[str, str | None]]:
    """Yields ``(global, top-level key)`` for every global the pickle uses under each key of
    its top-level dict. The pickle is read by an unpickler whose every global is an inert
    recorder (`_Recorded`), so nothing is imported or constructed."""
    payload = _RecordingUnpickler(io.BytesIO(data)).load()
    if not isinstance(payload, dict):
        for name in _names_in(payload):
            yield name, None
        return
    for key, value in payload.items():
        for name in _names_in(value):
            yield name, str(key)


class _Recorded:
    """Stands in for any global: records its name, the arguments and the state it was given."""

    _global = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.parts: list[Any] = [args, kwargs]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Recorded:
        inst = object.__new__(cls)
        inst.parts = [args, kwargs]
        return inst

    def __setstate__(self, state: Any) -> None:
        self.parts.append(state)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.parts.append((key, value))

    def append(self, value: Any) -> None:
        self.parts.append(value)

    def extend(self, values: Any) -> None:
        self.parts.append(list(values))


class _RecordingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2, torch's), mapped as the real unpickler does: __builtin__ -> builtins
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        return type("Recorded", (_Recorded,), {"_global": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Any:
        return None  # tensor storages: not needed to find globals


def _dtype_class_of(item: _Recorded) -> list[str]:
    """``numpy.dtype('O8', ...)`` is built by the allowed ``numpy.dtype``, but its class (here
    ``ObjectDType``) must be allowed too: name it, so the entry holding it is reported."""
    args = item.parts[0]
    if type(item)._global != "numpy.dtype" or not args or not isinstance(args[0], str):
        return []
    try:
        return [global_name(type(np.dtype(args[0])))]
    except TypeError:
        return []


def _names_in(value: Any) -> list[str]:
    names: list[str] = []
    seen: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, type) and issubclass(item, _Recorded):
            names.append(item._global)
        elif isinstance(item, _Recorded):
            names.append(type(item)._global)
            names.extend(_dtype_class_of(item))
            todo.extend(item.parts)
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo.extend(item)
    return names
