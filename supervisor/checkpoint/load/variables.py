"""TensorFlow's checkpoint reader API (SPEC §13): `list_variables`, `load_variable`, `CheckpointReader`.

A checkpoint's ``state.pt`` is opened with ``torch.load(mmap=True, weights_only=True)``: the
pickled structure is read, but every tensor stays a view of the mapped file, so listing names,
shapes and dtypes touches no tensor data, and `load_variable` copies exactly one entry into
memory (measured in ``tests/cli/test_cli_inspect_memory.py``). A file truncated under the map
would end the process with SIGBUS when a tensor is copied: `CheckpointReader.get_tensor` checks
the file's size first and reports a changed file as damage (the window left is that check's).

Variable names
--------------
The saved mapping is flattened with ``/`` between levels, the first level being the training
state's entry name and the next the entry's own ``state_dict()`` key, unchanged::

    global_step                          # int -> 0-dim int64 tensor (floats: float64)
    model/encoder.0.weight               # entry "model", state-dict key "encoder.0.weight"
    optimizer/state/0/exp_avg            # nested mappings: one "/" per level
    optimizer/param_groups/0/lr          # numbers -> 0-dim tensors
    optimizer/param_groups/0/params      # a list of numbers -> one 1-D tensor
    rng/0/torch                          # per-rank RNG states

So the part after ``model/`` is exactly the key `supervisor.restore_partial` matches with its
``include``/``exclude`` globs (``restore_partial(..., include="encoder.*")`` loads the
variables listed here as ``model/encoder.*``), and TF users find TF's ``scope/variable`` shape.
Leaves that are neither tensors nor numbers (strings, None) are not variables; lists holding
anything but numbers are flattened by index. The internal ``__meta__`` record is left out.

Sharded checkpoints (``checkpoint_format="dcp"``: ``.metadata`` + shard files, no ``state.pt``)
are read through ``torch.distributed.checkpoint``'s metadata and one-item loads, in one process:
their tensors are listed under the same ``entry/key`` names (DCP keys an optimizer's state by
parameter name: ``optimizer/state/fc.weight/exp_avg``), plus ``global_step`` from the manifest;
their non-tensor values are not (DCP stores those pickled). ``.metadata`` is unpickled with
only DCP's metadata classes allowed (`supervisor.checkpoint.formats.dcp_reading`): DCP's own reader uses
plain ``pickle``.

Accepted ``ckpt``: a checkpoint directory (``logdir/model.ckpt-1200``), a log directory (the
checkpoint its index names, else the highest-step committed one — TF's ``latest_checkpoint``,
without verification), or a single file written by ``torch.save`` (e.g. a pre-trained state dict).
Checkpoint directories are size-checked against their manifest by default (cheap; ``verify="full"``
also compares checksums, which reads the whole file).

``supervisor.load_checkpoint(path)`` keeps its §5.8 meaning (the whole saved mapping, verified);
TF's ``tf.train.load_checkpoint`` object is `CheckpointReader` here.

Object stores (``s3://bucket/prefix``, ``storage_options=``): nothing is mapped there, and one
tensor never costs the whole object. ``torch.load(map_location="meta")`` reads only the zip's
central directory, the pickle and each record's local header (ranged ``GetObject`` requests
with ``If-Match`` on the ETag listed, so every byte comes from one version): the names, shapes
and dtypes, and each tensor's offset in the object (``_checkpoint_offset``, which torch sets for
meta loads). `CheckpointReader.get_tensor` then reads exactly that tensor's bytes with one
ranged request. (torch.save's zip format allows this because its records are stored, not
compressed; a safetensors file would give the same offsets from its JSON header.) A sharded
checkpoint on an object store is listed from its ``.metadata`` alone (sizes checked against the
listing), and `CheckpointReader.get_tensor` reads exactly the byte ranges of that tensor's
shards (`supervisor.checkpoint.formats.dcp_storage.StorageDcpReader`).
"""
from __future__ import annotations

import logging
import numbers
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from supervisor.checkpoint.layout.format import MANIFEST_FILE, META_KEY, STATE_FILE, read_manifest
from supervisor.checkpoint.layout.format_registry import LazyVariable, format_in, format_of
from supervisor.checkpoint.layout.index import latest_checkpoint
from supervisor.checkpoint.load.loader import is_remote, resolve_storage, verify_checkpoint
from supervisor.checkpoint.load.ranged import RangedFile, resolve_remote
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.storage import Location, Storage
from supervisor.checkpoint.layout.verify import VERIFY_MODES, check_checkpoint
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError

__all__ = ["CheckpointReader", "VariableInfo", "list_variables", "load_variable", "resolve_checkpoint"]

logger = logging.getLogger(__name__)

SEPARATOR = "/"


@dataclass(frozen=True)
class VariableInfo:
    """One variable of a checkpoint: its name, shape, dtype and size in bytes (of the tensor
    `load_variable` returns)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def resolve_checkpoint(ckpt: str | os.PathLike | Location, *,
                       storage_options: Mapping[str, Any] | None = None) -> str:
    """The checkpoint directory or file ``ckpt`` designates (see the module docstring); for an
    object-store URL, the URL of the checkpoint prefix or object. ``ckpt`` may be a resolved
    `Location` (its storage is used; no ``storage_options`` then).

    Raises:
        CheckpointNotFoundError: nothing at ``ckpt``, or a directory holding no checkpoint.
    """
    return checkpoint_in(*resolve_storage(ckpt, storage_options=storage_options))


def checkpoint_in(storage: Storage, path: str) -> str:
    """`resolve_checkpoint` of ``path`` in its ``storage``'s spelling, through that storage."""
    if is_remote(storage):
        return resolve_remote(storage, path.rstrip("/"))
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointNotFoundError(f"no checkpoint at {path}: no such file or directory")
    if os.path.isfile(os.path.join(path, MANIFEST_FILE)) or os.path.isfile(os.path.join(path, STATE_FILE)):
        return path
    latest = latest_checkpoint(path)
    if latest is not None:
        return latest
    sealed = []
    for name in storage.listdir(path):
        try:
            sealed.append((read_manifest(os.path.join(path, name)).step, name))
        except (OSError, ValueError):
            continue
    if not sealed:
        raise CheckpointNotFoundError(f"{path} holds no checkpoint (no index naming one, no directory "
                                      f"with a {MANIFEST_FILE})")
    return os.path.join(path, max(sealed)[1])


class CheckpointReader:
    """Reads variables of one checkpoint without loading the others (TF's ``CheckpointReader``).

    Example::

        with CheckpointReader("runs/exp1") as reader:          # the latest checkpoint
            shapes = reader.get_variable_to_shape_map()
            w = reader.get_tensor("model/encoder.0.weight")    # one tensor, copied out

    Args:
        ckpt: a checkpoint directory, a log directory or a ``torch.save`` file.
        verify: ``"size"`` (default: manifest present, file sizes match) or ``"full"`` (also
            checksums; reads the whole file once).
        trusted_globals: extra globals ``torch.load(weights_only=True)`` may accept.

    Raises:
        CheckpointNotFoundError, CheckpointCorruptError: as `supervisor.verify_checkpoint`.
        CheckpointError: the file needs a global that is not trusted.
    """

    def __init__(self, ckpt: str | os.PathLike | Location, *, verify: str = "size",
                 trusted_globals: Iterable[Any] = (), storage_options: Mapping[str, Any] | None = None) -> None:
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY_MODES))}, got {verify!r}")
        storage, where = resolve_storage(ckpt, storage_options=storage_options)  # resolved once
        unpickling = Unpickling(trusted_globals)  # and the allow-list
        self.path = checkpoint_in(storage, where)
        self.step: int | None = None
        self._ranged: RangedFile | None = None
        self._storage: Storage | None = None  # a sharded checkpoint's, on an object store
        if is_remote(storage):
            self._open_remote(storage, verify, unpickling)
            return
        file_path = self.path
        if os.path.isdir(self.path):
            self.step = check_checkpoint(self.path, verify).step
            file_path = os.path.join(self.path, STATE_FILE)
            fmt = format_in(self.path)
            if fmt is not None and fmt.variables is not None:  # not torch.save's variables (a sharded one)
                self._variables = {"global_step": self.step, **fmt.variables(self.path, None)}
                return
        try:
            payload = unpickling.load(file_path, mmap=True, step=self.step)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
            raise CheckpointCorruptError(f"{file_path} cannot be read ({type(e).__name__}: {e})") from e
        self._variables: dict[str, Any] | None = dict(_flatten(payload))
        self._file_path, self._file_size = file_path, _size_of(file_path)

    def _open_remote(self, storage: Storage, verify: str, unpickling: Unpickling) -> None:
        directory, name = storage.dirname(self.path), storage.basename(self.path)
        if storage.exists(storage.join(self.path, MANIFEST_FILE)):
            manifest = verify_checkpoint(self.path, verify, storage=storage)
            self.step = manifest.step
            fmt = format_of(manifest.files)
            if fmt is not None and fmt.variables is not None:  # not torch.save's variables (a sharded one)
                self._storage = storage
                self._variables = {"global_step": self.step, **fmt.variables(self.path, storage)}
                return
            # under the save's data root, when the manifest names one (fencing.py)
            directory, name = storage.join(self.path, manifest.root) if manifest.root else self.path, STATE_FILE
        self._ranged = RangedFile(storage, directory, name)
        try:
            payload = self._ranged.load_structure(unpickling, self.step)
        except CheckpointError:
            self._ranged.close()
            raise
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
            self._ranged.close()
            raise CheckpointCorruptError(f"{self._ranged.where} cannot be read ({type(e).__name__}: {e})") from e
        self._variables = dict(_flatten(payload))

    @property
    def _vars(self) -> dict[str, Any]:
        if self._variables is None:
            raise RuntimeError(f"the reader of {self.path} is closed")
        return self._variables

    def variables(self) -> list[VariableInfo]:
        """Every variable's name, shape, dtype and byte size, in the saved order."""
        out = []
        for name, value in self._vars.items():
            if isinstance(value, LazyVariable):
                shape, dtype = value.shape, value.dtype
            else:
                tensor = _as_tensor(value)
                shape, dtype = tuple(tensor.shape), tensor.dtype
            numel = 1
            for size in shape:
                numel *= size
            out.append(VariableInfo(name, shape, dtype, numel * dtype.itemsize))
        return out

    def get_variable_to_shape_map(self) -> dict[str, tuple[int, ...]]:
        return {v.name: v.shape for v in self.variables()}

    def get_variable_to_dtype_map(self) -> dict[str, torch.dtype]:
        return {v.name: v.dtype for v in self.variables()}

    def has_tensor(self, name: str) -> bool:
        return name in self._vars

    def get_tensor(self, name: str) -> torch.Tensor:
        """A copy of the variable ``name`` in memory (a number comes back as a 0-dim tensor).

        Raises:
            KeyError: no such variable; the message lists close names.
        """
        try:
            value = self._vars[name]
        except KeyError:
            raise KeyError(_missing_message(self.path, name, self._vars)) from None
        if isinstance(value, LazyVariable):
            return value.load(self.path, self._storage)
        if self._ranged is not None and isinstance(value, torch.Tensor):
            return self._ranged.tensor(value)
        if isinstance(value, torch.Tensor) and _size_of(self._file_path) != self._file_size:
            raise CheckpointCorruptError(f"{self._file_path} changed size since it was opened (truncated or "
                                         "rewritten); its tensors can no longer be read: open it again")
        return _as_tensor(value).clone()

    def close(self) -> None:
        """Drops the mapping (tensors returned by `get_tensor` are copies and stay valid)."""
        self._variables = None
        if self._ranged is not None:
            self._ranged.close()
            self._ranged = None

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CheckpointReader({self.path!r}, step={self.step})"


def list_variables(ckpt: str | os.PathLike, *,
                   storage_options: Mapping[str, Any] | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """``[(name, shape)]`` of every variable in ``ckpt`` (TF's ``tf.train.list_variables``),
    sorted by name as TF sorts them, read without loading tensor data.
    (`CheckpointReader.variables` keeps the saved order.)"""
    with CheckpointReader(ckpt, storage_options=storage_options) as reader:
        return sorted((v.name, v.shape) for v in reader.variables())


def load_variable(ckpt: str | os.PathLike, name: str, *,
                  storage_options: Mapping[str, Any] | None = None) -> torch.Tensor:
    """The one variable ``name`` of ``ckpt`` (TF's ``tf.train.load_variable``), e.g.
    ``load_variable(logdir, "global_step")``; only that entry's bytes are read (on an object
    store: ranged reads, see the module docstring).

    Raises:
        KeyError: ``ckpt`` has no variable ``name``.
    """
    with CheckpointReader(ckpt, storage_options=storage_options) as reader:
        return reader.get_tensor(name)


# ---------------------------------------------------------------- flattening
def _flatten(value: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, torch.Tensor) or _is_number(value):
        yield prefix, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not prefix and key == META_KEY:
                continue
            yield from _flatten(item, f"{prefix}{SEPARATOR}{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        if all(_is_number(v) for v in value):  # an empty list too: a variable of shape (0,)
            yield prefix, list(value)
        else:
            for i, item in enumerate(value):
                yield from _flatten(item, f"{prefix}{SEPARATOR}{i}" if prefix else str(i))


def _size_of(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, numbers.Integral, numbers.Real)) and not isinstance(value, torch.Tensor)


def _as_tensor(value: Any) -> torch.Tensor:
    """Tensors as they are; Python floats as float64 (no rounding), ints as int64, bools as bool."""
    if isinstance(value, torch.Tensor):
        return value
    values = value if isinstance(value, list) else [value]
    exact = any(isinstance(v, numbers.Real) and not isinstance(v, numbers.Integral) for v in values)
    return torch.tensor(value, dtype=torch.float64 if exact else None)


def _missing_message(path: str, name: str, variables: Mapping[str, Any]) -> str:
    head = name.split(SEPARATOR, 1)[0]
    close = [n for n in variables if n.split(SEPARATOR, 1)[0] == head][:5] or list(variables)[:5]
    return f"{path} has no variable {name!r}; names look like {close} (list them with list_variables)"
