"""Copying a committed checkpoint from the local tier into the logdir (SPEC §17).

`persist_copy` is the persist worker's one storage operation: it reads the local checkpoint's
``MANIFEST.json``, streams every file it lists into a checkpoint staged in the logdir with the
logdir's own protocol (`supervisor.checkpoint.save.temp.TempCheckpoint`: a ``.tmp-`` directory
renamed into place on a filesystem; on an object store, files under a fresh data root, then the
manifest created last under the writer's lease generation), and commits it only after checking
what arrived:

* the checksum of the bytes sent (computed while they are written, no second read) must equal
  the local manifest's: a local file damaged after its commit is never persisted;
* the size of every file in the staged checkpoint (``TempCheckpoint.seal`` stats each) must be
  the size sent; the staged checkpoint is fresh, so the sealed manifest lists exactly the local
  manifest's files.

A failure or a kill at any point leaves at most a temp directory / a manifest-less prefix,
which the next writer opening the logdir removes: the logdir never lists a partial copy.
"""
from __future__ import annotations

from typing import Any, Callable

from supervisor.checkpoint.layout.format import MANIFEST_FILE, Manifest, read_manifest
from supervisor.checkpoint.storage import Storage
from supervisor.checkpoint.save.temp import CommitResult, TempCheckpoint
from supervisor.errors import CheckpointCorruptError

__all__ = ["COPY_CHUNK_BYTES", "persist_copy"]

#: How much of a file is in memory at once while it is copied.
COPY_CHUNK_BYTES = 8 << 20


def persist_copy(source: str, source_storage: Storage, directory: str, name: str, storage: Storage, *,
                 generation: int | None = None, before_commit: Callable[[], Any] | None = None) -> CommitResult:
    """Copies the committed checkpoint ``source`` to ``directory/name`` on ``storage``, verified
    (see the module docstring); ``before_commit()`` runs right before the commit (the writer's
    lease check). Raises `CheckpointCorruptError` when the source does not match its manifest
    (nothing is committed), or the storage's `OSError`."""
    try:
        manifest = read_manifest(source, source_storage)
    except (OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{source}: {MANIFEST_FILE} cannot be read ({e})") from e
    temp = TempCheckpoint.create(directory, name, storage, generation=generation)
    try:
        for relpath, record in manifest.files.items():
            sent = temp.write_file(relpath, lambda w, r=relpath: _stream(source_storage, source, manifest, r, w))
            if sent != record:
                raise CheckpointCorruptError(
                    f"{source_storage.join(source, relpath)}: {sent.size} bytes with checksum {sent.checksum} were "
                    f"read, its manifest says {record.size} bytes with {record.checksum} (the local copy is "
                    "damaged); not persisting it")
    except BaseException:
        temp.discard()
        raise
    return temp.finalize(step=manifest.step, wall_time=manifest.wall_time, world_size=manifest.world_size,
                         before_commit=before_commit)


def _stream(source_storage: Storage, source: str, manifest: Manifest, relpath: str, writer: Any) -> None:
    with source_storage.open_read(source_storage.join(source, manifest.key(relpath))) as f:
        while chunk := f.read(COPY_CHUNK_BYTES):  # the storage's own streams, end to end
            writer.write(chunk)
