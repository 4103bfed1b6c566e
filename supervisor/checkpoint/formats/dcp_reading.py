"""Load a sharded (``checkpoint_format="dcp"``) checkpoint from bytes already read and verified
(`supervisor.checkpoint.load.loader.read_checkpoint`, SPEC §10.4, §12): how an evaluator in another
process reads a checkpoint written by FSDP2/DTensor ranks into its plain, non-distributed model.

`read_checkpoint` opens every file the manifest lists (``.metadata``, the ranks' ``.distcp``
shards, ``rng-<rank>.pt``), reads each once while checking its CRC-32, and hands the bytes here.
`load_payload` then runs ``torch.distributed.checkpoint``'s own loading (its planner
reassembles every tensor whole from the shards of any number of ranks: resharding to one
process) over those bytes in memory — never the files again, so retention deleting the
checkpoint meanwhile changes nothing, and nothing is read that was not verified. It returns a
payload shaped like ``state.pt``'s: ``{"global_step": N, "model": {name: tensor}, ...}`` with
every entry the trainer saved (an optimizer's state is keyed by parameter name, as DCP saves
it). The ranks' RNG files are not part of it (an evaluation draws nothing from them).

Unpickling stays as safe as for ``state.pt`` (no arbitrary code from a checkpoint):

- DCP writes ``.metadata`` with plain ``pickle`` and its own reader loads it unrestricted; here it
  is unpickled with only DCP's metadata classes, ``torch.Size``, dtypes, layouts, memory formats
  and paths allowed — anything else is refused with an error naming the global;
- tensors are read by ``torch.load(weights_only=True)`` (as DCP does), and non-tensor entries
  (DCP pickles those whole with ``weights_only=False``) through the reader's `Unpickling` record,
  with the same ``trusted_globals`` opt-in as ``state.pt``.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from supervisor.checkpoint.layout.fencing import data_path
from supervisor.checkpoint.formats.dcp_ranges import ITEM_CRC, check_item
from supervisor.checkpoint.formats.dcp_replicated import SharedItems, serve_shared
from supervisor.checkpoint.layout.format import STEP_KEY
from supervisor.checkpoint.formats.memory_file import MemoryFile
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.storage import LocalStorage, Storage
from supervisor.checkpoint.layout.verify import DCP_METADATA
from supervisor.errors import CheckpointCorruptError, CheckpointError

__all__ = ["load_payload", "read_metadata", "read_metadata_file", "safe_dcp_load", "safe_file_reader",
           "safe_load_planner"]

_LOCAL = LocalStorage()
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch", "Size"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"), ("builtins", "set"), ("builtins", "frozenset"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` with an allowlist of what DCP itself pickles there."""

    def __init__(self, data: bytes | bytearray, where: str) -> None:
        super().__init__(io.BytesIO(data))
        self._where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == _METADATA_MODULE:  # the classes defined there, not what it imports
            import torch.distributed.checkpoint.metadata as dcp_metadata

            found = getattr(dcp_metadata, name, None)
            if isinstance(found, type) and found.__module__ == _METADATA_MODULE:
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise CheckpointError(f"{self._where}: {DCP_METADATA} references {module}.{name}, which is not part of "
                              "torch.distributed.checkpoint's metadata; it is not unpickled (a checkpoint "
                              "cannot run code in the process that reads it)")


def read_metadata(data: bytes | bytearray, where: str) -> Any:
    """DCP's ``Metadata`` from the bytes of a ``.metadata`` file, unpickled with the allowlist.

    Raises:
        CheckpointError: the file references another global.
        CheckpointCorruptError: the file cannot be unpickled or is not DCP metadata.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(data, where).load()
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise CheckpointCorruptError(f"{where}: {DCP_METADATA} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(metadata, Metadata):
        raise CheckpointCorruptError(f"{where}: {DCP_METADATA} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def read_metadata_file(path: str, storage: Storage | None = None) -> Any:
    """`read_metadata` of the ``.metadata`` file in the checkpoint directory ``path`` (read
    through ``storage``; default: the local one, regular files only)."""
    storage = storage or _LOCAL
    return _metadata_at(data_path(path, storage), storage)


def _metadata_at(path: str, storage: Storage) -> Any:
    try:
        data = storage.read_bytes(storage.join(path, DCP_METADATA))
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: {DCP_METADATA} cannot be read ({e})") from e
    return read_metadata(data, path)


def safe_file_reader(path: str, metadata: Any = None, items: SharedItems | None = None) -> Any:
    """DCP's ``FileSystemReader`` for the checkpoint directory ``path``, reading ``.metadata``
    with the allowlist (its tensors are read with ``weights_only=True`` as always). ``metadata``:
    the checkpoint's metadata, already read with `read_metadata_file` (else read on demand).
    ``items``: bytes of items already read and checked (`dcp_replicated.serve_shared`)."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeMetadataReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            # Always the global metadata (never a rank-local file DCP falls back to), allowlisted.
            return metadata if metadata is not None else read_metadata_file(path)

        def read_data(self, plan: Any, planner: Any) -> Any:
            return super().read_data(serve_shared(self, plan, planner, items), planner)

        def _slice_file(self, file: Any, sinfo: Any) -> Any:
            if getattr(sinfo, ITEM_CRC, None) is None:  # a checkpoint verified whole before
                return super()._slice_file(file, sinfo)
            data = _pread(file, sinfo.offset, sinfo.length)  # exactly the item: no read-ahead
            check_item(data, sinfo, path)  # this rank's range, verified as it is read
            return io.BytesIO(data)

    return SafeMetadataReader(path)


def _pread(file: Any, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset`` of an open file, read by ``pread`` (short at its end)."""
    try:
        fd = file.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        file.seek(offset)
        return file.read(length)
    parts, done = [], 0
    while done < length:
        part = os.pread(fd, length - done, offset + done)
        if not part:
            break
        parts.append(part)
        done += len(part)
    return b"".join(parts)


class _MemoryFileSystem:
    """The part of DCP's file-system interface its reader uses, over the files' verified bytes."""

    def __init__(self, root: str, contents: Mapping[str, bytearray]) -> None:
        self._root, self._contents = root, contents

    def init_path(self, path: str | os.PathLike) -> str:
        return os.fspath(path)

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return os.path.join(os.fspath(path), suffix)

    def exists(self, path: str | os.PathLike) -> bool:
        return os.path.relpath(os.fspath(path), self._root) in self._contents

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.RawIOBase]:
        name = os.path.relpath(os.fspath(path), self._root)
        if mode != "rb":
            raise PermissionError(f"{path}: a verified checkpoint is read-only")
        if name not in self._contents:
            raise CheckpointCorruptError(f"{self._root}: {DCP_METADATA} names {name!r}, a file the manifest "
                                         "does not list")
        stream = MemoryFile(self._contents[name], os.fspath(path))
        try:
            yield stream
        finally:
            stream.close()


def _reader(root: str, contents: Mapping[str, bytearray], metadata: Any) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class VerifiedBytesReader(FileSystemReader):
        """DCP's file-system reader over bytes in memory, with the metadata already parsed."""

        def __init__(self) -> None:
            super().__init__(root)
            self.fs = _MemoryFileSystem(root, contents)  # type: ignore[assignment]

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    return VerifiedBytesReader()


class _SafeBytesMixin:
    """``load_bytes`` for a DCP load planner: a non-tensor entry is unpickled with
    ``weights_only=True`` (`Unpickling.load`: the reader's allow-list, on the CPU) instead of
    DCP's ``weights_only=False``."""

    unpickling: Unpickling
    where: str

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        # Named in errors as the checkpoint and the entry (a non-tensor value: small).
        stream = MemoryFile(bytearray(value.getbuffer()), f"{self.where} ({read_item.dest_index.fqn})")
        try:
            loaded = self.unpickling.load(stream)
        finally:
            stream.close()
        if self.flatten_state_dict:  # type: ignore[attr-defined]
            mapping = self.mappings[read_item.dest_index.fqn]  # type: ignore[attr-defined]
            set_element(self.original_state_dict, mapping, loaded)  # type: ignore[attr-defined]
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded  # type: ignore[attr-defined]


def _planner(unpickling: Unpickling, where: str) -> Any:
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    class SafeBytesPlanner(_SafeBytesMixin, _EmptyStateDictLoadPlanner):
        """Rebuilds the state dict from the metadata (no template needed), unpickling safely."""

    planner = SafeBytesPlanner()
    planner.unpickling, planner.where = unpickling.at("cpu"), where
    return planner


def safe_load_planner(path: str, unpickling: Unpickling = Unpickling()) -> Any:
    """DCP's ``DefaultLoadPlanner`` (loads into the given state dict's tensors, in place) with
    non-tensor entries unpickled by ``unpickling`` (on the CPU) instead of ``weights_only=False``."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeLoadPlanner(_SafeBytesMixin, DefaultLoadPlanner):
        pass

    planner = SafeLoadPlanner()
    planner.unpickling, planner.where = unpickling.at("cpu"), path
    return planner


def safe_dcp_load(state_dict: dict[str, Any], path: str, *, no_dist: bool = True,
                  unpickling: Unpickling = Unpickling(), storage: Storage | None = None, metadata: Any = None,
                  items: SharedItems | None = None) -> None:
    """``torch.distributed.checkpoint.load(state_dict, checkpoint_id=path)`` that cannot run code
    from the checkpoint: ``.metadata`` through the allowlist (`safe_file_reader`), non-tensor
    entries through ``unpickling``, the restorer's allow-list (`safe_load_planner`). Every restore of a sharded
    checkpoint loads through here (never ``dcp.load`` directly). ``storage``: the checkpoint's
    (default: the local one); on an object store the shards are read by ranged requests
    (`supervisor.checkpoint.formats.dcp_storage.StorageDcpReader`): only what ``state_dict`` needs.
    ``items``: bytes of items already read and checked, by file and offset (the replicated items
    the chief sent): loaded from there, never read from storage.

    Raises:
        CheckpointError: the checkpoint references a global that is not allowed (named).
        Exception: what ``dcp.load`` raises for anything else (its ``CheckpointException`` is
            a ``BaseException``: callers catch it).
    """
    import torch.distributed.checkpoint as dcp

    storage = storage or _LOCAL
    path = data_path(path, storage)  # on an object store, the root the manifest names (fencing.py)
    if metadata is None:  # (``metadata``: already read, checked against the manifest)
        metadata = _metadata_at(path, storage)  # first: a refused global is raised as is, not wrapped by DCP
    if storage.is_object_store:
        from supervisor.checkpoint.formats.dcp_storage import StorageDcpReader  # lazy: imports DCP

        reader = StorageDcpReader(storage, path, metadata, items)
    else:
        reader = safe_file_reader(path, metadata, items)
    try:
        with _unwrapped_errors(path, damage=False):
            dcp.load(state_dict, storage_reader=reader, planner=safe_load_planner(path, unpickling),
                     no_dist=no_dist)
    finally:
        getattr(reader, "close", lambda: None)()


def load_payload(path: str, step: int, contents: Mapping[str, bytearray], *,
                 unpickling: Unpickling = Unpickling()) -> dict[str, Any]:
    """The payload of the sharded checkpoint at ``path`` (step ``step``) from its files' verified
    bytes (``contents``: file name -> bytes, ``.metadata`` included), its tensors on
    ``unpickling.map_location``, its non-tensor entries under ``unpickling``'s allow-list.

    Raises:
        CheckpointError: an untrusted global (named, with the opt-in).
        CheckpointCorruptError: the metadata or a shard cannot be read.
    """
    # The loader under dcp.load, as torch's own dcp_to_torch_save calls it: dcp.load would fill
    # a copy of the (empty) dict; the planner rebuilds the state dict from the metadata.
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    device = _device(unpickling.map_location)
    metadata = read_metadata(contents[DCP_METADATA], path)
    state_dict: dict[str, Any] = {}
    reader, planner = _reader(path, contents, metadata), _planner(unpickling, path)
    with _unwrapped_errors(path, damage=True):
        _load_state_dict(state_dict, storage_reader=reader, planner=planner, no_dist=True)
    if device is not None:
        state_dict = _to(state_dict, device)
    return {STEP_KEY: step, **state_dict}


def _device(map_location: Any) -> torch.device | None:
    """Where a sharded checkpoint's tensors go: None for the CPU (where DCP loads them)."""
    if map_location is None:
        return None
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device (a string or torch.device) for a sharded checkpoint, "
                        f"got {map_location!r}; load it on the CPU (map_location='cpu') and move the model")
    device = torch.device(map_location)
    return None if device.type == "cpu" else device


@contextlib.contextmanager
def _unwrapped_errors(path: str, *, damage: bool) -> Iterator[None]:
    """Around a DCP load: a `CheckpointError` raised inside it (DCP re-raises every rank's
    failure as its ``CheckpointException``, a ``BaseException``) comes out as itself; with
    ``damage`` any other failure is `CheckpointCorruptError` naming ``path``, else re-raised."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        yield
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps a reader's failure
        inner = _checkpoint_error_inside(e)
        if inner is not None:
            raise inner from None
        if not damage:
            raise
        raise CheckpointCorruptError(f"{path}: the sharded checkpoint cannot be loaded ({type(e).__name__}: {e})") from e


def _checkpoint_error_inside(error: BaseException) -> CheckpointError | None:
    """A `CheckpointError` raised inside DCP's load (it re-raises as ``CheckpointException``,
    keeping each rank's failure in ``failures``)."""
    for failure in getattr(error, "failures", {}).values():  # rank -> (exception, traceback)
        if isinstance(failure, tuple) and failure and isinstance(failure[0], CheckpointError):
            return failure[0]
    seen = error.__cause__ or error.__context__
    return seen if isinstance(seen, CheckpointError) else None


def _to(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value
