"""What ``torch.load(weights_only=True)`` may build beyond torch's own allowlist (SPEC §5.4).

Three things live here:

- `NUMPY_SAFE_GLOBALS`: the few NumPy reconstructors a checkpoint needs for NumPy scalars
  (``np.float64(0.5)``, ``np.int64(3)``, ``np.bool_``) and arrays of numeric, bool, str or
  bytes dtype, which user objects commonly put in their ``state_dict()``. They are allowed on
  every load. Each one only rebuilds a value from raw bytes and a dtype: ``scalar(dtype,
  bytes)``, ``_reconstruct(ndarray, shape, typecode)`` followed by ``ndarray.__setstate__``,
  ``dtype(spec)`` and the dtype classes (whose ``__setstate__`` sets byte order and flags). No
  other callable is opened: object arrays (``dtype=object``), structured/void dtypes and
  ``ndarray`` subclasses still need ``trusted_globals``.
- `Unpickling`: the frozen record of one reader's allow-list (NumPy's above and the user's
  ``trusted_globals``, checked and joined once) and ``map_location``, made where a read starts and
  handed to the load chain instead of the two parameters (issue 32). Its ``load`` is the one
  ``torch.load`` of the runtime (always ``weights_only=True``); for a checkpoint that still needs
  globals its refusal lists them all at once, with the state entries each one is used in, read
  statically from the pickle (`supervisor.checkpoint.formats.pickle_scan`: nothing is built).
- `describe_load_error`: a failed load in words that never repeat torch's advice to load unsafely.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import pickle
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch

from supervisor.checkpoint.formats.dangerous_globals import dangerous_names
from supervisor.checkpoint.formats.pickle_scan import global_name, globals_by_entry, pickle_bytes
from supervisor.errors import CheckpointError

__all__ = ["NUMPY_SAFE_GLOBALS", "Unpickling", "UntrustedCheckpointError", "check_loadable", "check_trusted_globals",
           "describe_load_error", "global_name", "untrusted_message"]

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


_BUILD_REFUSED = re.compile(r"but got <class '([\w.]+)'>")
_GLOBAL_REFUSED = re.compile(r"GLOBAL ([\w.]+)")


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


def check_trusted_globals(trusted: Any) -> tuple:
    """``trusted_globals`` as a tuple of classes or functions (or ``(object, "module.name")``
    pairs); `TypeError` naming the item otherwise."""
    if isinstance(trusted, (str, bytes)) or not isinstance(trusted, Iterable):
        raise TypeError("trusted_globals must be a list of classes or functions (the objects, not "
                        f"their names), got {trusted!r}")
    trusted = tuple(trusted)
    for i, item in enumerate(trusted):
        ok = callable(item) or (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str))
        if not ok:
            raise TypeError(f"trusted_globals[{i}] must be a class or function (or a (object, "
                            f"'module.name') pair), got {item!r}")
    return trusted


@dataclass(frozen=True)
class Unpickling:
    """How one reader unpickles verified checkpoints (SPEC §5.4): its allow-list and where the
    tensors go, resolved once where the read starts (`CheckpointManager`, `WorkerSessionCreator`,
    `read_checkpoint`, `load_checkpoint`, ...) and handed to the load chain as one record
    (issue 32), never as ``trusted_globals`` and ``map_location`` passed down beside each other.

    Attributes:
        trusted_globals: the user's classes/functions ``torch.load(weights_only=True)`` may build
            (checked by `check_trusted_globals`: a `TypeError` names a bad item).
        map_location: ``torch.load``'s (``"cpu"``; a sharded checkpoint takes a device only).
        allowed: NumPy's `NUMPY_SAFE_GLOBALS` and ``trusted_globals``: what
            ``torch.serialization.safe_globals`` is given at every load (joined once, here).
    """

    trusted_globals: tuple = ()
    map_location: Any = "cpu"
    allowed: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        trusted = check_trusted_globals(self.trusted_globals)
        object.__setattr__(self, "trusted_globals", trusted)
        object.__setattr__(self, "allowed", (*NUMPY_SAFE_GLOBALS, *trusted))

    def at(self, map_location: Any) -> Unpickling:
        """The same allow-list, the tensors going to ``map_location`` (``"meta"``: shapes only)."""
        return dataclasses.replace(self, map_location=map_location)

    def load(self, file: Any, *, step: int | None = None, mmap: bool = False, shown_as: str | None = None) -> Any:
        """``torch.load(file, weights_only=True)`` with `allowed` allowlisted, the one
        ``torch.load`` of the runtime. ``shown_as`` names the file in messages (a private copy's
        ``/proc/self/fd/N`` path means nothing to the user).

        Raises:
            UntrustedCheckpointError: the file needs other globals; names each, where it is
                used, and the opt-in (never for a global that may be malicious).
            Exception: whatever ``torch.load`` raises for a damaged file.
        """
        try:
            with torch.serialization.safe_globals(list(self.allowed)):
                return torch.load(file, map_location=self.map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            missing = self.untrusted(file, e)  # every missing global at once, with the entries using it
            if not missing:
                raise
            # torch's message advises unsafe loading: never chained, never repeated
            raise UntrustedCheckpointError(untrusted_message(shown_as or file, step, missing), missing) from None

    def untrusted(self, file: Any, error: BaseException) -> dict[str, list[str]]:
        """Every global ``file`` needs that is not `allowed`, each with the top-level entries of
        the payload (state entry names) using it: ``{global: [entry, ...]}``. ``error`` is the
        refusal ``torch.load`` raised; its global is always included, so the result is never
        empty even when the static scan fails."""
        allowed = {global_name(g) for g in self.allowed}
        found: dict[str, list[str]] = {}
        try:
            for name in torch.serialization.get_unsafe_globals_in_checkpoint(file):
                if name not in allowed:
                    found[name] = []
            for name, entry in globals_by_entry(pickle_bytes(file)):
                if name.startswith("numpy.dtypes.") and name not in allowed:  # built, not a GLOBAL
                    found.setdefault(name, [])
                if name in found and entry is not None and entry not in found[name]:
                    found[name].append(entry)
        except Exception as e:  # noqa: BLE001 - the scan only improves the message
            logger.debug("could not scan %s for the globals it needs: %s", file, e)
        match = _GLOBAL_REFUSED.search(str(error)) or _BUILD_REFUSED.search(str(error))
        if match is not None:
            refused = match.group(1) if "." in match.group(1) else f"builtins.{match.group(1)}"
            found.setdefault(refused, [])
        return found

    def check_loadable(self, state_dict: Any, where: str, step: int | None) -> None:
        """Raises `CheckpointError` when ``state_dict`` (a training state's, as a checkpoint
        stores it) would not load back under this allow-list: the save that would write it fails
        instead of the resume after it (issue 22.19).

        Cheap: the tensors and NumPy arrays of its dicts, lists and tuples are replaced by empty
        tensors / one-element arrays of the same dtype, so only the structure and the other objects
        are pickled and unpickled, in memory; any other object is pickled whole (with what it holds).
        """
        buffer = io.BytesIO()
        torch.save(_skeleton(state_dict), buffer)
        try:
            buffer.seek(0)
            with torch.serialization.safe_globals(list(self.allowed)):
                torch.load(buffer, weights_only=True)
        except pickle.UnpicklingError as e:
            buffer.seek(0)
            missing = self.untrusted(buffer, e)
            raise CheckpointError("this checkpoint would not load at the next resume, so it was not written: "
                                  + untrusted_message(where, step, missing, saving=True)) from None


def check_loadable(state_dict: Any, trusted_globals: Iterable[Any], where: str, step: int | None) -> None:
    """`Unpickling.check_loadable` of ``trusted_globals``'s record: raises `CheckpointError` when
    ``state_dict`` would not load back at the next resume (named ``where``, of ``step``)."""
    Unpickling(trusted_globals).check_loadable(state_dict, where, step)


def _skeleton(value: Any) -> Any:
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
