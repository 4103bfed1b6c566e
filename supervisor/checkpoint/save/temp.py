"""A checkpoint being written: one staged directory, filled by one or many writers, sealed once.

The commit protocol (SPEC §5.1, §16) in two halves, so several processes can take part, on any
`supervisor.checkpoint.storage.Storage`:

* `TempCheckpoint.create` stages the checkpoint (`Storage.stage`: locally a fresh
  ``<directory>/<name>.tmp-<hex>/``; on an object store a root of this save alone under the
  final prefix, ``<name>/g<lease generation>-<hex>/``, which becomes a checkpoint only when the
  manifest naming it appears: fencing.py) — one process, the chief; other processes
  `attach` to it by path (e.g. the path broadcast to every rank).
* Any writer fills it: `write_file` writes one file through `Storage.open_write` (checksum
  while writing; fsync / multipart completion) and records its size and CRC-32; files written by
  other means (another rank, ``torch.distributed.checkpoint``) are recorded with `add_record`
  (their writer computed the checksum) or checksummed at seal time (`Storage.checksum`).
* One process `finalize`\\ s it: every file must be accounted for (recorded, or checksummed
  now), then `Storage.commit` writes ``MANIFEST.json`` last and makes the checkpoint visible —
  locally: manifest fsynced, directories fsynced, renamed to ``<directory>/<name>/``, parent
  fsynced; on an object store: the manifest created with ``If-None-Match: *``. A crash before
  that leaves only a temp directory / a manifest-less prefix, which a writer opening the logdir
  removes; after it, a whole checkpoint.

Example::

    temp = TempCheckpoint.create(logdir, "model.ckpt-100")
    temp.write_file("state.pt", lambda w: serialize(payload, w))
    result = temp.finalize(step=100, wall_time=time.time(), world_size=1)
    result.path  # logdir/model.ckpt-100
"""
from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from supervisor.checkpoint.layout import fencing
from supervisor.checkpoint.storage.fileio import Opener
from supervisor.checkpoint.layout.format import MANIFEST_FILE, FileRecord, Manifest, transient_base
from supervisor.checkpoint.storage.local import rename_into_place
from supervisor.checkpoint.storage import LocalStorage, Storage, StorageWriter, storage_for

__all__ = ["CommitResult", "TempCheckpoint", "remove_tree", "rename_into_place"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitResult:
    """A committed checkpoint: its path, its manifest and how long the write took."""

    path: str
    manifest: Manifest
    write_secs: float

    @property
    def nbytes(self) -> int:
        return sum(r.size for r in self.manifest.files.values())


class TempCheckpoint:
    """The staged directory of one checkpoint being written (see the module docstring).

    Args:
        directory: the logdir the checkpoint is committed into.
        name: the committed name (``<basename>-<step>``).
        path: the staged directory itself.
        storage: the logdir's storage (default: `storage_for(directory)`).
    """

    def __init__(self, directory: str, name: str, path: str, storage: Storage | None = None) -> None:
        self.directory = directory
        self.name = name
        self.path = path
        self.storage = storage if storage is not None else storage_for(directory)
        self.records: dict[str, FileRecord] = {}
        #: The object-store save's root under the final prefix, and its lease generation (fencing.py).
        self.root: str | None = None
        self.generation: int | None = None
        self._start = time.perf_counter()

    @classmethod
    def create(cls, directory: str, name: str, storage: Storage | None = None, *,
               generation: int | None = None) -> TempCheckpoint:
        """Stages a fresh checkpoint (locally a new ``<directory>/<name>.tmp-<hex>/``).

        On an object store the files go under a fresh root of this save,
        ``<name>/g<generation>-<hex>/`` (``generation``: the writer's lease generation), and
        nothing there is deleted: a committed checkpoint of the same step stays whole until the
        new manifest replaces its own (`fencing.commit_manifest`)."""
        storage = storage if storage is not None else storage_for(directory)
        if storage.is_object_store:
            root = fencing.data_root(generation)
            temp = cls(directory, name, storage.join(storage.join(directory, name), root), storage)
            temp.root, temp.generation = root, int(generation or 0)
            return temp
        try:
            path = storage.stage(directory, name)
        except FileExistsError:
            final = storage.join(directory, name)
            logger.debug("replacing the existing checkpoint %s with a new save of the same step", final)
            remains = storage.uncommit(final)
            if remains is not None:
                storage.remove_tree(remains)
            path = storage.stage(directory, name)
        return cls(directory, name, path, storage)

    @classmethod
    def attach(cls, path: str, storage: Storage | None = None) -> TempCheckpoint:
        """Joins a staged directory another process created (``path`` as it gave it)."""
        storage = storage if storage is not None else storage_for(path)
        base = storage.basename(path)
        if not storage.is_object_store:
            base = transient_base(base) if ".tmp-" in base else None
            if base is None:
                raise ValueError(f"{path!r} is not a checkpoint temp directory (<name>.tmp-<32 hex digits>)")
        if not storage.isdir(path):
            raise FileNotFoundError(f"the checkpoint temp directory {path} does not exist")
        return cls(storage.dirname(path), base, path, storage)

    @property
    def final_path(self) -> str:
        return self.storage.join(self.directory, self.name)

    def write_file(self, relpath: str, fill: Callable[[StorageWriter], Any],
                   opener: Opener | None = None) -> FileRecord:
        """Writes ``relpath`` with ``fill(writer)``, checksummed while writing and made durable
        (fsync / completed upload). ``opener`` (local storage only) opens the file instead of
        ``open(path, "xb")``: the fault-injection seam."""
        target = self.storage.join(self.path, relpath)
        with self._writer_storage(opener).open_write(target) as writer:
            fill(writer)
            writer.sync()
            record = FileRecord(writer.nbytes, writer.checksum)
        self.records[relpath] = record
        return record

    def _writer_storage(self, opener: Opener | None) -> Storage:
        if opener is None:
            return self.storage
        if self.storage.is_object_store:
            raise ValueError(f"opener={opener!r} applies to local directories only, not {self.path}")
        return LocalStorage(opener)

    def add_record(self, relpath: str, record: FileRecord) -> None:
        """Records a file some other writer put into the directory (and made durable)."""
        self.records[relpath] = record

    def files_present(self) -> list[str]:
        """Every file under the staged directory, as relative paths (``/``-separated)."""
        return self.storage.list_files(self.path)

    def seal(self, *, step: int, wall_time: float, world_size: int, opener: Opener | None = None) -> Manifest:
        """The manifest naming every file in the directory (`finalize` writes it, last).

        Files nobody recorded are made durable and checksummed here (one extra read); a
        recorded file whose size differs from its record is an error (`OSError`), never sealed.
        """
        records = dict(self.records)
        present = self.files_present()
        for rel in present:
            if rel == MANIFEST_FILE:
                raise OSError(errno.EEXIST, f"{self.path} already holds a {MANIFEST_FILE}")
            full = self.storage.join(self.path, rel)
            if rel not in records:
                records[rel] = FileRecord(*self.storage.checksum(full))
            elif (size := self.storage.stat(full).size) != records[rel].size:
                raise OSError(errno.EIO, f"{full} has {size} bytes, its writer recorded {records[rel].size}")
        missing = [rel for rel in records if rel not in present]
        if missing:
            raise OSError(errno.ENOENT, f"{self.path}: recorded file(s) {missing} are missing")
        return Manifest(step=int(step), wall_time=float(wall_time), torch_version=str(torch.__version__),
                        world_size=int(world_size), files=dict(sorted(records.items())), root=self.root,
                        generation=self.generation)

    def finalize(self, *, step: int, wall_time: float, world_size: int, opener: Opener | None = None,
                 before_commit: Callable[[], Any] | None = None) -> CommitResult:
        """Seals and commits (`Storage.commit`: the manifest last): the checkpoint exists.

        ``before_commit()`` runs after the seal, right before the commit: the writer's last
        chance to refuse (a lost lease raises there: nothing is committed).
        On any error the staged directory is removed and the error re-raised; a committed
        checkpoint of the same name is replaced only once the new one is sealed (locally).
        """
        try:
            manifest = self.seal(step=step, wall_time=wall_time, world_size=world_size, opener=opener)
            if before_commit is not None:
                before_commit()
            if self.root is not None:
                fencing.commit_manifest(self.storage, self.final_path, manifest, before_commit)
            else:
                self._writer_storage(opener).commit(self.path, self.final_path, manifest_name=MANIFEST_FILE,
                                                    manifest=manifest.to_json().encode("utf-8"))
        except BaseException:
            self.discard()
            raise
        if self.root is not None:
            fencing.sweep(self.storage, self.final_path, self.root, int(self.generation or 0))
        return CommitResult(self.final_path, manifest, time.perf_counter() - self._start)

    def discard(self) -> None:
        """Removes the staged directory (nothing committed is touched). Best effort: it runs
        while another error is being raised (which must not be replaced), so what cannot be
        removed is logged and left to the next writer opening the logdir."""
        try:
            self.storage.discard(self.path)
        except OSError as e:
            logger.warning("could not remove the unfinished checkpoint %s (%s); the next writer opening the "
                           "logdir removes it", self.path, e)


def remove_tree(path: str, storage: Storage | None = None) -> None:
    """Removes a directory tree, logging (WARNING) what it cannot remove instead of raising."""
    (storage if storage is not None else storage_for(path)).remove_tree(path)


def records_from_mapping(data: Mapping[str, Any]) -> dict[str, FileRecord]:
    """``{relpath: FileRecord}`` from ``{relpath: (size, checksum)}`` (e.g. gathered from ranks)."""
    return {str(k): FileRecord(int(v[0]), str(v[1])) for k, v in data.items()}
