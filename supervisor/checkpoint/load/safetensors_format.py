"""The ``safetensors`` checkpoint format (``CheckpointManager(checkpoint_format="safetensors")``):
the whole state in one ``state.safetensors`` file — no pickle anywhere, so restoring it runs no
code and needs no ``trusted_globals``; registered in `supervisor.checkpoint.layout.format_registry`.

Every tensor of the payload is a safetensors entry named by its nesting (``model/weight``,
``optimizer/state/0/momentum_buffer``; the ``/`` of `CheckpointReader`); everything else
(steps, hyper-parameters, the RNG states' numbers) is a JSON skeleton in the file's metadata,
where a tensor is ``{"__tensor__": name}``, a tuple ``{"__tuple__": [...]}``, a dict with other
than string keys ``{"__items__": [[key, value], ...]}`` and a NumPy array ``{"__ndarray__": name}``.
A value of another type is refused at the save, naming where it is. Needs ``pip install
safetensors`` (the ``safetensors`` extra), imported at the first save or read only.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Callable, Mapping

from supervisor.checkpoint.layout.format import Manifest, read_manifest
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, LazyVariable, register_format

__all__ = ["MARKER", "SAFETENSORS_FORMAT"]

MARKER = "state.safetensors"
_SKELETON = "supervisor.skeleton"


def _encode(value: Any, where: str, tensors: dict[str, Any]) -> Any:
    """The JSON skeleton of ``value``; its tensors go into ``tensors`` under their path."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        tensors[where] = value.detach().to("cpu", copy=True).contiguous()  # its own storage: none shared
        return {"__tensor__": where}
    if isinstance(value, np.ndarray):
        tensors[where] = torch.from_numpy(value.copy())
        return {"__ndarray__": where}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(v, f"{where}/{i}", tensors) for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{where}/{k}", tensors) for k, v in value.items()}
        return {"__items__": [[_encode(k, f"{where}/key", {}), _encode(v, f"{where}/{k}", tensors)]
                              for k, v in value.items()]}
    raise TypeError(f"checkpoint_format='safetensors' stores tensors, NumPy arrays and JSON values; "
                    f"{where.lstrip('/')} is a {type(value).__name__}: save it as one of those or use "
                    f"checkpoint_format='torch'")


def _decode(skeleton: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(skeleton, list):
        return [_decode(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        return skeleton
    if "__tensor__" in skeleton:
        return tensors[skeleton["__tensor__"]]
    if "__ndarray__" in skeleton:
        return tensors[skeleton["__ndarray__"]].numpy()
    if "__tuple__" in skeleton:
        return tuple(_decode(v, tensors) for v in skeleton["__tuple__"])
    if "__items__" in skeleton:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in skeleton["__items__"]}
    return {k: _decode(v, tensors) for k, v in skeleton.items()}


def _write(payload: Any, write_file: Callable[[str, Callable[[Any], None]], None]) -> None:
    from safetensors.torch import save

    tensors: dict[str, Any] = {}
    skeleton = json.dumps(_encode(payload, "", tensors))
    data = save({k.lstrip("/"): t for k, t in tensors.items()}, metadata={_SKELETON: skeleton})
    write_file(MARKER, lambda writer: writer.write(data))


def _read(path: str, manifest: Manifest, copies: dict[str, Any], unpickling: Any) -> tuple[Any, bool]:
    """The payload from the verified private copy of ``state.safetensors`` (tensors of their own,
    on ``unpickling.map_location``; nothing is unpickled: no allow-list needed)."""
    from safetensors.torch import load

    copy = copies.pop(MARKER)
    with copy.open(f"{path}/{MARKER}") as f:
        data = f.read()
    metadata = _header(data[:8], lambda n: data[8:8 + n]).get("__metadata__") or {}
    map_location = unpickling.map_location
    tensors = {f"/{k}": t.to(map_location) if map_location is not None else t for k, t in load(data).items()}
    return _decode(json.loads(metadata[_SKELETON]), tensors), False


def _header(head: bytes, read: Callable[[int], bytes]) -> dict:
    (length,) = struct.unpack("<Q", head)
    return json.loads(read(length))


class _Entry(LazyVariable):
    """A tensor of ``state.safetensors``, listed from the header, read on demand."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
        self.name, self.shape, self.dtype = name, shape, dtype

    def load(self, path: str, storage: Any = None) -> Any:
        from safetensors.torch import load

        store, file = _located(path, storage)
        return load(store.read_bytes(file))[self.name]


def _located(path: str, storage: Any) -> tuple[Any, str]:
    """``(storage, the file)``: ``state.safetensors`` where the manifest puts it (on an object
    store under the save's data root, `supervisor.checkpoint.layout.fencing`)."""
    from supervisor.checkpoint.storage import storage_for

    store = storage if storage is not None else storage_for(path)
    return store, store.join(path, read_manifest(path, store).key(MARKER))


def _variables(path: str, storage: Any = None) -> Mapping[str, Any]:
    """The tensors the header lists (dtype and shape; no tensor read)."""
    import torch

    store, file = _located(path, storage)
    header = _header(store.read_range(file, 0, 8), lambda n: store.read_range(file, 8, n))
    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}
    return {k: _Entry(k, tuple(v["shape"]), dtypes.get(v["dtype"], v["dtype"]))
            for k, v in header.items() if k != "__metadata__"}


SAFETENSORS_FORMAT = CheckpointFormat(name="safetensors", marker=MARKER, description="a safetensors checkpoint",
                                      read=_read, write=_write, torch_file=False, variables=_variables)
register_format(SAFETENSORS_FORMAT)
