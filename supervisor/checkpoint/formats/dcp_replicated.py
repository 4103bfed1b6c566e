"""The replicated items of a sharded checkpoint, read from storage once per job (issue 31).

DCP writes an item that every rank holds whole once — a non-tensor entry (an optimizer's param
groups, a step counter, plain state) or a tensor saved as a single chunk covering all of it
(Adam's ``step`` scalars under FSDP2; a replicated model's weights) — and every rank that loads it
reads it: W reads of the same bytes (≈ 20 KiB a rank for a small FSDP2 model with Adam: 2.7× the
checkpoint at W = 1,000). Instead, the chief reads them (`read_replicated`: each checked against
its CRC-32 as it is read, contiguous items in one ranged read) and sends them to every rank with
``.metadata`` (`supervisor.checkpoint.sharded.restore`); each rank checks every item it received
against its CRC-32 again (`split_replicated`: a copy that differs fails loudly, naming the item),
and DCP's reader takes those items from memory (`serve_shared`), the rest from storage as before.

Which items: `replicated_infos` — the same list on every rank, computed from ``.metadata`` alone
(sorted by file and offset), up to `REPLICATED_BUDGET` bytes in all (the memory each rank holds
them in); the items past it are read by each rank that needs them, as before. A checkpoint without
item checksums (written before issue 31) shares nothing: it is verified whole by the chief.
"""
from __future__ import annotations

import dataclasses
import io
from typing import Any, Mapping

import torch

from supervisor.checkpoint.formats.dcp_ranges import check_item, verifiable_by_ranges
from supervisor.checkpoint.storage import Storage
from supervisor.errors import CheckpointCorruptError

__all__ = ["REPLICATED_BUDGET", "replicated_infos", "read_replicated", "split_replicated", "serve_shared"]

#: The most bytes of replicated items the chief reads and sends (and every rank holds at once).
REPLICATED_BUDGET = 64 << 20
#: Items by ``(file, offset)``: their bytes, already checked.
SharedItems = Mapping[tuple[str, int], bytes]


def replicated_infos(metadata: Any, budget: int = REPLICATED_BUDGET) -> list[Any]:
    """The storage infos (``_StorageInfo``) of the items of DCP ``metadata`` that are saved whole:
    non-tensor entries and single-chunk tensors, ordered by file and offset, at most ``budget``
    bytes in all; none when the items have no CRC-32 (`verifiable_by_ranges`)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    if not verifiable_by_ranges(metadata):
        return []
    chosen, total = [], 0
    for index, info in sorted(metadata.storage_data.items(), key=lambda kv: (kv[1].relative_path, kv[1].offset)):
        entry = metadata.state_dict_metadata.get(index.fqn)
        whole = isinstance(entry, BytesStorageMetadata) or (
            isinstance(entry, TensorStorageMetadata) and len(entry.chunks) == 1
            and list(entry.chunks[0].sizes) == list(entry.size))
        if whole and total + info.length <= budget:
            chosen.append(info)
            total += info.length
    return chosen


def read_replicated(base: str, infos: list[Any], storage: Storage, where: str) -> bytes:
    """The chief's side: the bytes of ``infos`` (`replicated_infos`) read from the checkpoint's
    files under ``base`` (contiguous items in one ranged read), each checked against its CRC-32,
    concatenated in order.

    Raises:
        CheckpointCorruptError: a file cannot be read, or an item differs (named).
    """
    parts: list[bytes] = []
    for run in _contiguous(infos):
        first, length = run[0], sum(info.length for info in run)
        try:
            data = storage.read_range(storage.join(base, first.relative_path), first.offset, length)
        except OSError as e:
            raise CheckpointCorruptError(f"{where}: {first.relative_path} cannot be read ({e})") from e
        at = 0
        for info in run:
            part = data[at:at + info.length]
            check_item(part, info, where)
            parts.append(part)
            at += info.length
    return b"".join(parts)


def _contiguous(infos: list[Any]) -> list[list[Any]]:
    runs: list[list[Any]] = []
    for info in infos:
        last = runs[-1][-1] if runs else None
        if last is not None and last.relative_path == info.relative_path and last.offset + last.length == info.offset:
            runs[-1].append(info)
        else:
            runs.append([info])
    return runs


def split_replicated(data: bytes, infos: list[Any], where: str) -> dict[tuple[str, int], bytes]:
    """Every rank's side: ``data`` (`read_replicated`'s, as received) cut into its items, each
    checked against its CRC-32.

    Raises:
        CheckpointCorruptError: an item differs from the checkpoint's metadata (named).
    """
    items, at = {}, 0
    for info in infos:
        part = bytes(data[at:at + info.length])
        check_item(part, info, where)
        items[(info.relative_path, info.offset)] = part
        at += info.length
    return items


def serve_shared(reader: Any, plan: Any, planner: Any, items: SharedItems | None) -> Any:
    """Loads the items of DCP's load ``plan`` whose bytes are in ``items`` (as DCP's
    ``FileSystemReader.read_data`` does from a file) through ``planner``; returns the plan of the
    others, for the reader to read from storage."""
    if not items:
        return plan
    rest = []
    for request in plan.items:
        info = reader.storage_data[request.storage_index]
        data = items.get((info.relative_path, info.offset))
        if data is None or len(data) != info.length:
            rest.append(request)
        else:
            _load(reader, request, info, data, planner)
    return dataclasses.replace(plan, items=rest)


def _load(reader: Any, request: Any, info: Any, data: bytes, planner: Any) -> None:
    from torch.distributed._shard._utils import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    stream = reader.transforms.transform_load_stream(request, info.transform_descriptors or (), io.BytesIO(data))
    raw = io.BytesIO(stream.read(-1))
    if request.type == LoadItemType.BYTE_IO:
        planner.load_bytes(request, raw)
        return
    tensor = narrow_tensor_by_index(torch.load(raw, map_location="cpu", weights_only=True),
                                    request.storage_offsets, request.lengths)
    target = planner.resolve_tensor(request).detach()
    if target.size() != tensor.size():
        raise CheckpointCorruptError(f"{request.storage_index.fqn}: the checkpoint's item has size {tuple(tensor.size())}, "
                                     f"the state expects {tuple(target.size())}")
    target.copy_(tensor)
    planner.commit_tensor(request, target)
