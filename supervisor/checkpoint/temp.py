"""A checkpoint being written: one temp directory, filled by one or many writers, sealed once.

The commit protocol (SPEC §5.1) in two halves, so several processes can take part:

* `TempCheckpoint.create` makes ``<directory>/<name>.tmp-<hex>/`` (one process, the chief);
  other processes `attach` to it by path (e.g. the path broadcast to every rank).
* Any writer fills it: `write_file` writes one file through a `ChecksumWriter` (checksum while
  writing, fsync) and records its size and CRC-32; files written by other means (another rank,
  ``torch.distributed.checkpoint``) are recorded with `add_record` (their writer computed the
  checksum) or checksummed at seal time.
* One process `finalize`\\ s it: every file in the directory must be accounted for (recorded, or
  checksummed now), then ``MANIFEST.json`` is written and fsynced, the directory fsynced, renamed
  to ``<directory>/<name>/`` and the parent fsynced. A crash before the rename leaves only a
  ``*.tmp-*`` directory, which a writer opening the logdir removes; after it, a whole checkpoint.

Example::

    temp = TempCheckpoint.create(logdir, "model.ckpt-100")
    temp.write_file("state.pt", lambda w: serialize(payload, w))
    result = temp.finalize(step=100, wall_time=time.time(), world_size=1)
    result.path  # logdir/model.ckpt-100
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from supervisor.checkpoint.fileio import ChecksumWriter, Opener, checksum_file, default_opener, fsync_dir
from supervisor.checkpoint.format import (
    MANIFEST_FILE,
    FileRecord,
    Manifest,
    deleting_name,
    temp_name,
    transient_base,
)

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
    """The temp directory of one checkpoint being written (see the module docstring).

    Args:
        directory: the logdir the checkpoint is committed into.
        name: the committed name (``<basename>-<step>``).
        path: the temp directory itself.
    """

    def __init__(self, directory: str, name: str, path: str) -> None:
        self.directory = directory
        self.name = name
        self.path = path
        self.records: dict[str, FileRecord] = {}
        self._start = time.perf_counter()

    @classmethod
    def create(cls, directory: str, name: str) -> TempCheckpoint:
        """Makes a fresh ``<directory>/<name>.tmp-<hex>/`` directory."""
        path = os.path.join(directory, temp_name(name))
        os.mkdir(path)
        return cls(directory, name, path)

    @classmethod
    def attach(cls, path: str) -> TempCheckpoint:
        """Joins a temp directory another process created (``path`` as it gave it)."""
        base = transient_base(os.path.basename(path))
        if base is None or ".tmp-" not in os.path.basename(path):
            raise ValueError(f"{path!r} is not a checkpoint temp directory (<name>.tmp-<32 hex digits>)")
        if not os.path.isdir(path):
            raise FileNotFoundError(f"the checkpoint temp directory {path} does not exist")
        return cls(os.path.dirname(path), base, path)

    @property
    def final_path(self) -> str:
        return os.path.join(self.directory, self.name)

    def write_file(self, relpath: str, fill: Callable[[ChecksumWriter], Any],
                   opener: Opener | None = None) -> FileRecord:
        """Writes ``relpath`` with ``fill(writer)``, checksummed while writing and fsynced."""
        target = os.path.join(self.path, relpath)
        with ChecksumWriter((opener or default_opener)(target)) as writer:
            fill(writer)
            writer.sync()
            record = FileRecord(writer.nbytes, writer.checksum)
        self.records[relpath] = record
        return record

    def add_record(self, relpath: str, record: FileRecord) -> None:
        """Records a file some other writer put into the directory (and fsynced)."""
        self.records[relpath] = record

    def files_present(self) -> list[str]:
        """Every regular file under the temp directory, as relative paths (``/``-separated)."""
        found = []
        for root, _, files in os.walk(self.path):
            for name in files:
                found.append(os.path.relpath(os.path.join(root, name), self.path).replace(os.sep, "/"))
        return sorted(found)

    def seal(self, *, step: int, wall_time: float, world_size: int, opener: Opener | None = None) -> Manifest:
        """Writes ``MANIFEST.json`` naming every file in the directory, then fsyncs it.

        Files nobody recorded are fsynced and checksummed here (one extra read); a recorded
        file whose size on disk differs from its record is an error (`OSError`), never sealed.
        """
        records = dict(self.records)
        for rel in self.files_present():
            if rel == MANIFEST_FILE:
                raise OSError(errno.EEXIST, f"{self.path} already holds a {MANIFEST_FILE}")
            full = os.path.join(self.path, rel)
            if rel not in records:
                _fsync_file(full)
                size, checksum = checksum_file(full)
                records[rel] = FileRecord(size, checksum)
            elif os.path.getsize(full) != records[rel].size:
                raise OSError(errno.EIO, f"{full} has {os.path.getsize(full)} bytes, its writer "
                              f"recorded {records[rel].size}")
        missing = [rel for rel in records if not os.path.isfile(os.path.join(self.path, rel))]
        if missing:
            raise OSError(errno.ENOENT, f"{self.path}: recorded file(s) {missing} are missing")
        manifest = Manifest(step=int(step), wall_time=float(wall_time), torch_version=str(torch.__version__),
                            world_size=int(world_size), files=dict(sorted(records.items())))
        data = manifest.to_json().encode("utf-8")
        self.write_file(MANIFEST_FILE, lambda w: w.write(data), opener)
        for root, _, _ in os.walk(self.path):
            fsync_dir(root)
        return manifest

    def finalize(self, *, step: int, wall_time: float, world_size: int, opener: Opener | None = None,
                 rename: Callable[[str, str], None] | None = None,
                 before_commit: Callable[[], Any] | None = None) -> CommitResult:
        """Seals, renames into place and fsyncs the parent: the checkpoint is committed.

        ``before_commit()`` runs after the seal, right before the rename: the writer's last
        chance to refuse (a lost lease raises there: nothing is committed).
        On any error the temp directory is removed and the error re-raised; a committed
        checkpoint of the same name is replaced only once the new one is sealed.
        """
        try:
            manifest = self.seal(step=step, wall_time=wall_time, world_size=world_size, opener=opener)
            if before_commit is not None:
                before_commit()
            (rename or rename_into_place)(self.path, self.final_path)
            fsync_dir(self.directory)
        except BaseException:
            self.discard()
            raise
        return CommitResult(self.final_path, manifest, time.perf_counter() - self._start)

    def discard(self) -> None:
        """Removes the temp directory (nothing committed is touched)."""
        remove_tree(self.path)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_into_place(tmp: str, final: str) -> None:
    """Renames a sealed temp directory to its committed name (every commit goes through here;
    crash tests interpose on ``supervisor.checkpoint.temp.rename_into_place``).

    Re-saving a step that is already committed (e.g. after a hand rollback) moves the old one
    aside first, so the name always holds a complete checkpoint or none.
    """
    try:
        os.rename(tmp, final)
        return
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR) or not os.path.isdir(final):
            raise
    logger.info("replacing the existing checkpoint %s with a new save of the same step", final)
    aside = os.path.join(os.path.dirname(final), deleting_name(os.path.basename(final)))
    os.rename(final, aside)
    os.rename(tmp, final)
    remove_tree(aside)


def remove_tree(path: str) -> None:
    """``shutil.rmtree`` that logs (WARNING) what it cannot remove instead of raising."""
    def report(function: Any, failed_path: str, exc_info: Any) -> None:
        error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if not isinstance(error, FileNotFoundError):
            logger.warning("could not remove %s: %s", failed_path, error)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=report)
    else:
        shutil.rmtree(path, onerror=report)


def records_from_mapping(data: Mapping[str, Any]) -> dict[str, FileRecord]:
    """``{relpath: FileRecord}`` from ``{relpath: (size, checksum)}`` (e.g. gathered from ranks)."""
    return {str(k): FileRecord(int(v[0]), str(v[1])) for k, v in data.items()}
