"""Exports on an object store (``export_dir_base`` an ``s3://`` URL; SPEC §10.3, §16).

An object store has no rename, so an export gets the all-or-nothing meaning the checkpoints have
there: every file of ``<base>/<version>/`` is uploaded (its size and CRC-32 computed while it
uploads), then ``<base>/<version>/MANIFEST.json`` is written **last** with a create-only write
(``If-None-Match: *``). An export exists if and only if its manifest does:

- listings, the exporters' "best"/"latest" logic and the garbage collection see complete
  versions only;
- a version prefix without a manifest (a writer killed mid-upload, or mid-deletion) is removed,
  with a WARNING, by the next export into that base and by each exporter's first call in a
  process (which also aborts the unfinished multipart uploads a killed writer leaves: the
  store bills their parts until then);
- the garbage collection deletes only complete versions whose manifest is an export manifest
  (``"format": "torch-supervisor-export"``): the manifest first (from then on it is not an
  export), then the objects.

One process exports into a base at a time (the local ``train_and_evaluate`` or the evaluator
task; `Estimator.export` calls into one base in sequence): a manifest-less version is taken as
an interrupted export, never as another process's export in flight.

The manifest: ``{"format": "torch-supervisor-export", "version": 1700000000, "files": {name:
{"size": bytes, "checksum": "crc32:%08x"}}}``.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from supervisor.checkpoint import MANIFEST_FILE
from supervisor.checkpoint.storage.records import parse_json
from supervisor.checkpoint.storage import Storage

__all__ = ["EXPORT_FORMAT", "MANIFEST_MAX_BYTES", "upload_export", "list_object_exports", "remove_object_leftovers",
           "delete_object_export"]

logger = logging.getLogger(__name__)

EXPORT_FORMAT = "torch-supervisor-export"
MANIFEST_MAX_BYTES = 1 << 20
_CHUNK_BYTES = 8 << 20


def upload_export(storage: Storage, local_dir: str, base: str, version: int) -> str:
    """Uploads every file of ``local_dir`` to ``<base>/<version>/``, then its manifest last
    (create-only: `ObjectExistsError` if that version exists); returns the export's URL. On any
    error the version's objects are removed (best effort) and the error is raised: no export
    appears. ``version``: one above every version listed (`next_version`), so no object of a
    complete export is ever overwritten."""
    final = storage.join(base, str(version))
    try:
        files = {name: _upload_file(storage, os.path.join(local_dir, name), storage.join(final, name))
                 for name in sorted(os.listdir(local_dir))}
        manifest = {"format": EXPORT_FORMAT, "version": version, "files": files}
        storage.commit(final, final, manifest_name=MANIFEST_FILE,
                       manifest=json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))
    except BaseException:
        try:
            storage.discard(final)
        except Exception as e:  # noqa: BLE001 - the original error is the one to raise
            logger.warning("could not remove the objects of the failed export %s: %s (the next export removes "
                           "them)", final, e)
        raise
    return final


def _upload_file(storage: Storage, source: str, target: str) -> dict[str, Any]:
    writer = storage.open_write(target)
    try:
        with open(source, "rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                writer.write(chunk)
        writer.sync()
    finally:
        writer.close()
    return {"size": writer.nbytes, "checksum": writer.checksum}


def _versions(storage: Storage, base: str) -> tuple[set[str], set[str]]:
    """``(every version prefix, the complete ones)`` under ``base``, from one listing."""
    present, complete = set(), set()
    for key in storage.list_files(base):
        name, _, rest = key.partition("/")
        if name.isdigit() and rest:
            present.add(name)
            if rest == MANIFEST_FILE:
                complete.add(name)
    return present, complete


def list_object_exports(storage: Storage, base: str) -> list[tuple[str, str]]:
    """``(version, URL)`` of the complete exports under ``base``, oldest first."""
    return [(name, storage.join(base, name)) for name in sorted(_versions(storage, base)[1], key=int)]


def remove_object_leftovers(storage: Storage, base: str, *,
                            abort_uploads: bool = True) -> tuple[list[str], list[tuple[str, str]]]:
    """Removes, with a WARNING each, the version prefixes under ``base`` that hold no manifest
    (an export or a deletion interrupted) and (``abort_uploads``) aborts the unfinished
    multipart uploads of versions without one. Returns the URLs removed and the complete
    exports, as `list_object_exports` (one listing serves both)."""
    present, complete = _versions(storage, base)
    removed = []
    for name in sorted(present - complete, key=int):
        path = storage.join(base, name)
        logger.warning("removing %s, left behind by an interrupted export or deletion (no %s)", path, MANIFEST_FILE)
        storage.remove_tree(path)
        removed.append(path)
    if abort_uploads:  # the parts of a killed upload (object stores; none elsewhere)
        storage.abort_uploads(base, lambda name: name.isdigit() and name not in complete)
    return removed, [(name, storage.join(base, name)) for name in sorted(complete, key=int)]


def delete_object_export(storage: Storage, path: str) -> bool:
    """Deletes the complete export at ``path`` (manifest first, then its objects); False, with a
    WARNING, when its manifest is not an export manifest (not ours: left alone)."""
    manifest_path = storage.join(path, MANIFEST_FILE)
    try:
        manifest = parse_json(storage.read_bytes(manifest_path, max_bytes=MANIFEST_MAX_BYTES))  # untrusted
        ours = isinstance(manifest, dict) and manifest.get("format") == EXPORT_FORMAT
    except (OSError, ValueError) as e:
        logger.warning("not deleting %s: its %s cannot be read (%s)", path, MANIFEST_FILE, e)
        return False
    if not ours:
        logger.warning("not deleting %s: its %s is not an export manifest", path, MANIFEST_FILE)
        return False
    if storage.uncommit(path) is not None:
        storage.remove_tree(path)
    return True
