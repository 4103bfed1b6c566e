"""Reading one tensor of a checkpoint on an object store without the whole object (issue 24
item 6): what `supervisor.checkpoint.load.variables` (``list_variables``, ``load_variable``, the CLI's
``inspect``) uses for ``s3://`` URLs.

``state.pt`` is torch.save's zip archive, its records stored uncompressed. ``torch.load(...,
map_location="meta", weights_only=True)`` reads only the pickle, the zip's central directory and
each record's local header, and gives every tensor's storage the offset of its bytes in the file
(``_checkpoint_offset``). `RangedFile` serves those small reads from blocks of `BLOCK_BYTES`
fetched once each (ranged ``GetObject`` with ``If-Match`` on the ETag listed: one version),
then `RangedFile.tensor` reads exactly one tensor's bytes with one ranged request. Bytes read to
list the variables: the blocks touched (a few per tensor record); to load one: its size.
"""
from __future__ import annotations

import io
import os
from typing import Any

import torch

from supervisor.checkpoint.layout.format import MANIFEST_FILE, read_manifest
from supervisor.checkpoint.layout.index import latest_checkpoint
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.storage import Storage
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError

__all__ = ["BLOCK_BYTES", "RangedFile", "resolve_remote"]

BLOCK_BYTES = 16 << 10  # a record's local header and the pickle's pieces: a request each, not a megabyte


def resolve_remote(storage: Storage, url: str) -> str:
    """The checkpoint ``url`` designates on an object store: itself (a checkpoint prefix, or one
    object written by ``torch.save``), else the checkpoint its index names, else the highest-step
    prefix with a manifest."""
    if storage.exists(storage.join(url, MANIFEST_FILE)):
        return url
    if not storage.isdir(url):
        if storage.exists(url):
            return url
        raise CheckpointNotFoundError(f"no checkpoint at {url}: no such object or prefix")
    latest = latest_checkpoint(url, storage=storage)
    if latest is not None:
        return latest
    sealed = []
    for name in storage.listdir(url):
        try:
            sealed.append((read_manifest(storage.join(url, name), storage).step, name))
        except (OSError, ValueError):
            continue
    if not sealed:
        raise CheckpointNotFoundError(f"{url} holds no checkpoint (no index naming one, no prefix with a "
                                      f"{MANIFEST_FILE})")
    return storage.join(url, max(sealed)[1])


class _BlockCache(io.RawIOBase):
    """A seekable reader over a snapshot's reader, each `BLOCK_BYTES` block fetched once."""

    def __init__(self, file: Any, size: int) -> None:
        super().__init__()
        self._file, self._size, self._position = file, size, 0
        self._blocks: dict[int, bytes] = {}

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def _block(self, index: int) -> bytes:
        if index not in self._blocks:
            self._file.seek(index * BLOCK_BYTES)
            self._blocks[index] = self._file.read(min(BLOCK_BYTES, self._size - index * BLOCK_BYTES))
        return self._blocks[index]

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < view.nbytes and self._position < self._size:
            index, start = divmod(self._position, BLOCK_BYTES)
            piece = self._block(index)[start:start + view.nbytes - done]
            if not piece:
                break
            view[done:done + len(piece)] = piece
            done += len(piece)
            self._position += len(piece)
        return done


class RangedFile:
    """``state.pt`` (or a ``torch.save`` object) on an object store, read by ranges from one
    version: its structure loaded on the ``meta`` device, each tensor's bytes fetched on demand."""

    def __init__(self, storage: Storage, directory: str, name: str) -> None:
        self.where = storage.join(directory, name)
        self.snapshot = storage.open_snapshot(directory, [name])
        self.file = self.snapshot.files[name]
        self.size = self.snapshot.sizes[name]

    def load_structure(self, unpickling: Unpickling, step: int | None) -> Any:
        """The saved mapping with every tensor on the ``meta`` device (no tensor data read), under
        ``unpickling``'s allow-list."""
        return unpickling.at("meta").load(_BlockCache(self.file, self.size), step=step, shown_as=self.where)

    def tensor(self, meta: torch.Tensor) -> torch.Tensor:
        """The tensor ``meta`` describes, from its storage's bytes (one ranged read)."""
        storage = meta.untyped_storage()
        offset, nbytes = getattr(storage, "_checkpoint_offset", None), storage.nbytes()
        if offset is None:
            raise CheckpointCorruptError(f"{self.where}: no record offset for a tensor (not a torch.save zip?)")
        data = bytearray(nbytes)
        self.file.seek(offset)
        got = self.file.readinto(data) if nbytes else 0
        if got != nbytes:
            raise CheckpointCorruptError(f"{self.where}: a tensor's record ends after {got} of {nbytes} bytes")
        raw = torch.frombuffer(data, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        out = torch.empty(0, dtype=meta.dtype)
        return out.set_(raw.untyped_storage(), meta.storage_offset(), meta.shape, meta.stride()).clone()

    def close(self) -> None:
        self.snapshot.close()
