"""What ``torch.load(weights_only=True)`` may build beyond torch's own allowlist (SPEC §5.4).

Two things live here:

- `NUMPY_SAFE_GLOBALS`: the few NumPy reconstructors a checkpoint needs for NumPy scalars
  (``np.float64(0.5)``, ``np.int64(3)``, ``np.bool_``) and arrays of numeric, bool, str or
  bytes dtype, which user objects commonly put in their ``state_dict()``. They are allowed on
  every load. Each one only rebuilds a value from raw bytes and a dtype: ``scalar(dtype,
  bytes)``, ``_reconstruct(ndarray, shape, typecode)`` followed by ``ndarray.__setstate__``,
  ``dtype(spec)`` and the dtype classes (whose ``__setstate__`` sets byte order and flags). No
  other callable is opened: object arrays (``dtype=object``), structured/void dtypes and
  ``ndarray`` subclasses still need ``trusted_globals``.
- `describe_untrusted`: for a checkpoint that still needs globals, the full list at once with
  the state entries each one is used in, read statically from the pickle (nothing is built).

`safe_torch_load` is the one ``torch.load`` of the runtime (always ``weights_only=True``, the
allowlist above plus ``trusted_globals``), and `describe_load_error` words a failed load without
ever repeating torch's advice to load unsafely.
"""
from __future__ import annotations

import _compat_pickle
import io
import logging
import pickle
import re
from collections import OrderedDict
from typing import Any, Iterable

import numpy as np
import torch

from supervisor.checkpoint.formats.dangerous_globals import dangerous_names
from supervisor.errors import CheckpointError

__all__ = ["NUMPY_SAFE_GLOBALS", "UntrustedCheckpointError", "allowed_globals", "check_loadable", "describe_load_error",
           "describe_untrusted", "global_name", "safe_torch_load", "untrusted_message"]

logger = logging.getLogger(__name__)


def _numpy_safe_globals() -> list[Any]:
    try:  # NumPy >= 2
        from numpy._core import multiarray
    except ImportError:  # pragma: no cover - NumPy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    kinds = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
             np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128, np.str_, np.bytes_]
    dtype_classes = sorted({type(np.dtype(kind)) for kind in kinds}, key=lambda c: c.__name__)
    found: list[Any] = [multiarray.scalar, multiarray._reconstruct, np.ndarray, np.dtype, *dtype_classes]
    # A checkpoint written under NumPy 1.x names the reconstructors numpy.core.multiarray.*.
    found += [(multiarray.scalar, "numpy.core.multiarray.scalar"),
              (multiarray._reconstruct, "numpy.core.multiarray._reconstruct")]
    return found


#: Allowed on every load: NumPy scalars and numeric/bool/str/bytes arrays (see the module doc).
NUMPY_SAFE_GLOBALS: tuple[Any, ...] = tuple(_numpy_safe_globals())


def allowed_globals(trusted_globals: Iterable[Any] = ()) -> list[Any]:
    """The list to hand to ``torch.serialization.safe_globals``: NumPy's plus the user's."""
    return [*NUMPY_SAFE_GLOBALS, *trusted_globals]


def global_name(item: Any) -> str:
    """``module.qualname`` of an allowlist item (an object or an ``(object, name)`` pair)."""
    if isinstance(item, tuple):
        return item[1]
    return f"{getattr(item, '__module__', '?')}.{getattr(item, '__qualname__', getattr(item, '__name__', '?'))}"


_BUILD_REFUSED = re.compile(r"but got <class '([\w.]+)'>")
_GLOBAL_REFUSED = re.compile(r"GLOBAL ([\w.]+)")


def describe_untrusted(file_path: str, error: BaseException, trusted_globals: Iterable[Any] = ()) -> dict[str, list[str]]:
    """Every global ``file_path`` needs that is not allowed, each with the top-level entries of
    the checkpoint payload (state entry names) that use it: ``{global: [entry, ...]}``.

    ``error`` is the refusal ``torch.load`` raised; its global is always included, so the
    result is never empty even when the static scan fails.
    """
    allowed = {global_name(g) for g in allowed_globals(trusted_globals)}
    found: dict[str, list[str]] = {}
    try:
        import torch

        for name in torch.serialization.get_unsafe_globals_in_checkpoint(file_path):
            if name not in allowed:
                found[name] = []
        for name, entry in _globals_by_entry(_pickle_bytes(file_path)):
            if name.startswith("numpy.dtypes.") and name not in allowed:  # built, not a GLOBAL
                found.setdefault(name, [])
            if name in found and entry is not None and entry not in found[name]:
                found[name].append(entry)
    except Exception as e:  # noqa: BLE001 - the scan only improves the message
        logger.debug("could not scan %s for the globals it needs: %s", file_path, e)
    match = _GLOBAL_REFUSED.search(str(error)) or _BUILD_REFUSED.search(str(error))
    if match is not None:
        refused = match.group(1) if "." in match.group(1) else f"builtins.{match.group(1)}"
        found.setdefault(refused, [])
    return found


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint needs globals ``torch.load(weights_only=True)`` does not allow: ``names``,
    and ``malicious`` when one of them is a global no checkpoint legitimately holds
    (`supervisor.checkpoint.formats.dangerous_globals`)."""

    def __init__(self, message: str, names: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.names = tuple(names)
        self.malicious = bool(dangerous_names(self.names))


def untrusted_message(file_path: str, step: int | None, missing: dict[str, list[str]], *, saving: bool = False) -> str:
    """The refusal: every missing global at once, where each is used, and the opt-in — never
    for a global no checkpoint legitimately holds: then the file may be malicious (``saving``:
    the state about to be saved holds one)."""
    def shown(name: str) -> str:
        return name[len("builtins."):] if name.startswith("builtins.") else name

    def where(entries: list[str]) -> str:
        noun = "entry" if len(entries) == 1 else "entries"
        return f" (in state {noun} {', '.join(map(repr, entries))})" if entries else ""

    missing = dict(sorted(missing.items()))
    listing = ", ".join(f"{shown(name)}{where(entries)}" for name, entries in missing.items())
    names = ", ".join(shown(name) for name in missing)
    at_step = f" (step {step})" if step is not None else ""
    noun = "the global" if len(missing) == 1 else f"{len(missing)} globals"
    dangerous = ", ".join(shown(name) for name in dangerous_names(missing))
    if dangerous:
        return f"{file_path}{at_step} needs {noun} {listing}, " + _dangerous_advice(dangerous, saving)
    return (f"{file_path}{at_step} needs {noun} {listing}, which torch.load(weights_only=True) does not "
            "allow; torch-supervisor never unpickles unsafely. If you trust this checkpoint, pass "
            f"trusted_globals=[{names}] (the class or function objects themselves) to the front door "
            "(Supervisor, MonitoredTrainingSession, SingularMonitoredSession) or to CheckpointManager / "
            "load_checkpoint, to allow exactly those; or make the entry's state_dict() return tensors, "
            "numbers, strings and containers")


def _dangerous_advice(dangerous: str, saving: bool) -> str:
    what = (f"{dangerous} can spawn processes, run or import code, or reach files, sockets or any attribute: "
            "no state_dict() legitimately holds such a global (loading it would run it)")
    if saving:
        return (f"which torch.load(weights_only=True) refuses. {what}, and allowing it in trusted_globals would "
                "let any checkpoint run code on load; make the entry's state_dict() return tensors, numbers, "
                "strings and containers")
    return (f"which torch.load(weights_only=True) refused, so nothing in it ran. {what}, so this file may be "
            "malicious: crafted to run code when it is loaded. Do not add it to trusted_globals; find out who "
            "wrote it, delete it, and restore an older checkpoint (`python -m supervisor rollback LOGDIR STEP` "
            "points the index at one)")


def _pickle_bytes(file_path: str) -> bytes:
    import torch.serialization as ts

    if hasattr(file_path, "seek"):  # an in-memory file (check_loadable), read once already
        file_path.seek(0)  # type: ignore[attr-defined]
    # torch's own zip reader: checkpoints are written without per-record CRCs, which the
    # zipfile module would reject.
    with ts._open_file_like(file_path, "rb") as opened, ts._open_zipfile_reader(opened) as reader:
        return reader.get_record("data.pkl")


def _globals_by_entry(data: bytes) -> Iterable[tuple[str, str | None]]:
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


def check_loadable(state_dict: Any, trusted_globals: Iterable[Any], where: str, step: int | None) -> None:
    """Raises `CheckpointError` when ``state_dict`` (a training state's, as a checkpoint stores
    it) would not load back under ``torch.load(weights_only=True)`` with ``trusted_globals``:
    the save that would write it fails instead of the resume after it (issue 22.19).

    Cheap: the tensors and NumPy arrays of its dicts, lists and tuples are replaced by empty
    tensors / one-element arrays of the same dtype, so only the structure and the other objects are pickled and
    unpickled, in memory; any other object is pickled whole (with what it holds).
    """
    import torch

    buffer = io.BytesIO()
    torch.save(_skeleton(state_dict), buffer)
    try:
        buffer.seek(0)
        with torch.serialization.safe_globals(allowed_globals(trusted_globals)):
            torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as e:
        buffer.seek(0)
        missing = describe_untrusted(buffer, e, trusted_globals)  # type: ignore[arg-type]
        raise CheckpointError("this checkpoint would not load at the next resume, so it was not written: "
                              + untrusted_message(where, step, missing, saving=True)) from None


def _skeleton(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return torch.empty(0, dtype=value.dtype)  # (a tensor subclass's own globals go unchecked)
    if isinstance(value, np.ndarray) and type(value) is np.ndarray and value.dtype != object and value.size > 1:
        return value.reshape(-1)[:1].copy()  # one element: an empty array pickles differently
    if type(value) in (dict, OrderedDict):
        copy = type(value)((k, _skeleton(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            copy._metadata = value._metadata  # type: ignore[attr-defined]
        return copy
    if type(value) in (list, tuple):
        return type(value)(_skeleton(v) for v in value)
    return value


# ---------------------------------------------------------------- the one torch.load
def safe_torch_load(file_path: Any, *, map_location: Any = "cpu", trusted_globals: Iterable[Any] = (),
                    step: int | None = None, mmap: bool = False, shown_as: str | None = None) -> Any:
    """``torch.load(file_path, weights_only=True)`` with ``trusted_globals`` allowlisted.
    ``shown_as`` names the file in messages (a private copy's ``/proc/self/fd/N`` path means
    nothing to the user).

    Raises:
        CheckpointError: the file needs another global; names it and the opt-in.
        Exception: whatever ``torch.load`` raises for a damaged file.
    """
    trusted_globals = list(trusted_globals)
    try:
        with torch.serialization.safe_globals(allowed_globals(trusted_globals)):
            return torch.load(file_path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # Every missing global at once, with the state entries using it.
        missing = describe_untrusted(file_path, e, trusted_globals)
        if not missing:
            raise
        # torch's message advises unsafe loading: never chained, never repeated
        raise UntrustedCheckpointError(untrusted_message(shown_as or file_path, step, missing), missing) from None


def describe_load_error(error: Exception, *, is_zip: bool = True) -> str:
    """A load error in words that never repeat torch's advice to load unsafely (``is_zip``:
    whether the file starts like the zip archive ``torch.save`` writes)."""
    if isinstance(error, pickle.UnpicklingError):
        reason = _unpickler_reason(str(error))
        zip_note = "" if is_zip else "; it is not a zip archive as torch.save writes"
        return (f"torch.load(weights_only=True) refused it ({reason}){zip_note}: the file needs globals or "
                "pickle operations that are not allowed (a file crafted to run code looks like this), or it "
                "is damaged. torch-supervisor never unpickles unsafely")
    return _strip_unsafe_advice(f"{type(error).__name__}: {error}")


_ADVICE = re.compile(r"[^.\n]*weights_only[`'\s]*(?:set to|=)\s*`?False[^.\n]*\.?", re.IGNORECASE)


def _strip_unsafe_advice(text: str) -> str:
    return _ADVICE.sub("", text).strip()


def _unpickler_reason(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    core = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation",
                                                           "Please file an issue"))
            and "weights_only" not in line]
    core = [line.replace("WeightsUnpickler error:", "").strip() for line in core]
    return _strip_unsafe_advice("; ".join(c for c in core if c)) or "an unsupported pickle"
