"""The ``dcp`` checkpoint format (``checkpoint_format="dcp"``): a sharded
``torch.distributed.checkpoint`` — its ``.metadata`` and one shard file per rank, no
``state.pt``; registered in `supervisor.checkpoint.layout.format_registry`. DCP itself is imported only when a
checkpoint of this format is read."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Mapping

from supervisor.checkpoint.layout.format import Manifest
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, LazyVariable, register_format
from supervisor.checkpoint.layout.verify import DCP_METADATA

__all__ = ["DCP_FORMAT"]


def _read(path: str, manifest: Manifest, copies: dict[str, Any], unpickling: Any) -> tuple[Any, bool]:
    """The state assembled from the verified copies of the shards by DCP's own loading
    (`supervisor.checkpoint.formats.dcp_reading.load_payload`); never mapped."""
    from supervisor.checkpoint.formats.dcp_reading import load_payload

    contents = {name: copy.data for name, copy in copies.items()}
    return load_payload(path, manifest.step, contents, unpickling=unpickling), False


@dataclass(frozen=True)
class _DcpEntry(LazyVariable):
    """A tensor of a ``torch.distributed.checkpoint`` checkpoint, read on demand."""

    fqn: str
    shape: tuple[int, ...]
    dtype: Any

    def load(self, path: str, storage: Any = None) -> Any:
        """This tensor alone (on an object store: ranged reads of its shards' bytes only)."""
        import torch

        from supervisor.checkpoint.formats.dcp_reading import safe_dcp_load

        tensor = torch.empty(self.shape, dtype=self.dtype)
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
            safe_dcp_load({self.fqn: tensor}, path, no_dist=True, storage=storage)
        return tensor


def _variables(path: str, storage: Any = None) -> Mapping[str, Any]:
    """The tensors a DCP checkpoint's ``.metadata`` describes, named like ``state.pt``'s (the
    saved nesting joined with ``/``). Non-tensor values (DCP pickles them) are not listed."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from supervisor.checkpoint.formats.dcp_reading import read_metadata_file
    from supervisor.checkpoint.load.variables import SEPARATOR

    metadata = read_metadata_file(path, storage)  # unpickled with DCP's metadata classes allowed, nothing else
    nesting = getattr(metadata, "planner_data", None) or {}
    out = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            keys = nesting.get(fqn)
            name = SEPARATOR.join(map(str, keys)) if isinstance(keys, (tuple, list)) and keys else fqn
            out[name] = _DcpEntry(fqn, tuple(md.size), md.properties.dtype)
    return out


DCP_FORMAT = CheckpointFormat(
    name="dcp", marker=DCP_METADATA, description="a sharded torch.distributed.checkpoint", read=_read,
    single_file=False, restore_hint="load it with supervisor.checkpoint.sharded.load_into", variables=_variables)
register_format(DCP_FORMAT)
