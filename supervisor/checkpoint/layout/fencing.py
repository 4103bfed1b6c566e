"""Fencing the late writes of a writer that lost its lease, on object stores (SPEC §16).

A lease holder can be paused (a GC pause, a VM freeze, ``scontrol suspend``) after its last lease
check with a write in flight; the store applies that write whenever it arrives — possibly after
another writer took the logdir over. No lease check can stop a request already sent, so every
publishing write is made harmless by its name or its condition, ordered by the lease generation
(the generations of successive holders only grow: lease.py):

* **Data**: a checkpoint's files go under a root of that save alone,
  ``<name>/g<generation:016d>-<random>/`` (`data_root`), which its manifest names (``root``,
  manifest format version 2). A late upload lands under its writer's own root: it never
  overwrites another writer's files. A save deletes nothing it finds under ``<name>/``.
* **Manifest** (`commit_manifest`): created with ``If-None-Match: *``. If one exists, it is read:
  written by an older generation (a paused writer's late manifest, or this writer's own earlier
  save of the same step) it is replaced with ``If-Match`` on the version read; by a newer one,
  this writer was overtaken: `LeaseLostError`, nothing written. After the commit, `sweep` removes
  what is not the new checkpoint's (the replaced save's root, a paused writer's leftovers).
* **Index** (`claim_index`, `index_text`): every write records the writer's lease generation
  (a comment line: each writer's index has its own content, so its own ETag) and is conditional
  on the version the writer read or last wrote (``If-Match``). The new holder rewrites the index
  with its generation when it opens the logdir, so a paused writer's late index write fails its
  precondition. An index an older generation wrote after that (a paused writer's first index)
  is replaced (`older_index_version`).

What a late write can still leave: a manifest committed for a step the new holder never saves
(not in the index: restore never takes it, as it never jumps past the index) and files under
a dead root (removed with their checkpoint).
"""
from __future__ import annotations

import logging
import os
import re

from supervisor.checkpoint.layout.format import MANIFEST_FILE, MANIFEST_MAX_BYTES, Manifest
from supervisor.checkpoint.ownership.lease import LeaseLostError
from supervisor.checkpoint.storage.base import ObjectExistsError, PreconditionFailedError, Storage
from supervisor.errors import CheckpointNotFoundError

__all__ = ["OrphanedManifestError", "WRITER_LINE", "check_not_orphaned", "claim_index", "commit_manifest", "data_path",
           "data_root", "index_generation", "index_text", "is_claim_only", "older_index_version", "sweep"]

logger = logging.getLogger(__name__)

#: The index line naming the lease generation of the writer that wrote it (a text-format comment).
WRITER_LINE = "# written by the lease generation "
_WRITER = re.compile(r"# written by the lease generation (\d+)\s*")
_ROOT_GENERATION = re.compile(r"^g(\d{16})-")
_ATTEMPTS = 5
_INDEX_MAX_BYTES = 16 << 20


class OrphanedManifestError(CheckpointNotFoundError):
    """A manifest whose data root holds nothing: a paused writer's late manifest, landed after
    the new holder removed its files as the leftovers of an interrupted write. It never was a
    checkpoint: restore passes over it (WARNING) instead of counting it as damage."""


def check_not_orphaned(path: str, manifest: Manifest, keys) -> None:
    """Raises `OrphanedManifestError` when ``manifest`` names a root no key of ``keys`` (the
    checkpoint prefix's listing) lies under."""
    if manifest.root and not any(key.startswith(manifest.root + "/") for key in keys):
        raise OrphanedManifestError(f"{path}: its {MANIFEST_FILE} names the data root {manifest.root}, which holds "
                                    "nothing (written late by a writer that had lost the lease; never a checkpoint)")


def data_root(generation: int | None) -> str:
    """A fresh root for one save's files: ``g<generation:016d>-<16 random hex digits>``."""
    return f"g{int(generation or 0):016d}-{os.urandom(8).hex()}"


# ---------------------------------------------------------------- the manifest
def commit_manifest(storage: Storage, final: str, manifest: Manifest, before_commit=None) -> Manifest | None:
    """Writes ``final/MANIFEST.json`` (see the module docstring); returns the manifest it
    replaced, or None. ``before_commit()`` runs again right before a replacement.

    Raises:
        LeaseLostError: a newer lease generation committed this step (this writer was overtaken).
        OSError: the store failed, or the manifest kept changing.
    """
    path, data = storage.join(final, MANIFEST_FILE), manifest.to_json().encode("utf-8")
    ours = int(manifest.generation or 0)
    for _ in range(_ATTEMPTS):
        try:
            storage.create_exclusive(path, data)
            return None
        except ObjectExistsError:
            pass
        try:
            raw, info = storage.read_versioned(path, max_bytes=MANIFEST_MAX_BYTES)
        except FileNotFoundError:
            continue  # removed meanwhile: create it
        existing = _parsed(raw)
        theirs = -1 if existing is None or existing.generation is None else existing.generation
        if theirs > ours:
            raise LeaseLostError(f"{final} was committed by a newer writer (lease generation {theirs}; this "
                                 f"writer's is {ours}): this writer was overtaken and must not commit")
        if before_commit is not None:
            before_commit()
        logger.info("replacing the existing checkpoint %s (lease generation %s) with a new save of the same "
                    "step (generation %d)", final, "?" if theirs < 0 else theirs, ours)
        try:
            storage.replace_if(path, data, info.version)
        except (PreconditionFailedError, FileNotFoundError):
            continue
        return existing
    raise OSError(f"{path} kept changing while this writer committed it ({_ATTEMPTS} attempts)")


def _parsed(raw: bytes) -> Manifest | None:
    try:
        return Manifest.from_json(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None  # damaged: replaced like a stale one


def sweep(storage: Storage, final: str, root: str, generation: int) -> None:
    """Removes everything under ``final/`` but its manifest, ``root/`` and the roots of newer
    lease generations (a newer holder's save in progress, when this writer is the paused one):
    a replaced save's files, a paused writer's leftovers. Best effort: what cannot be removed is
    logged."""
    try:
        keys = storage.list_files(final)
    except OSError as e:
        logger.warning("could not list %s to remove what is not its checkpoint's: %s", final, e)
        return
    tops = {key.split("/", 1)[0]: "/" in key for key in keys if key != MANIFEST_FILE}
    for top, is_prefix in sorted(tops.items()):
        newer = _ROOT_GENERATION.match(top)
        if top == root or (newer is not None and int(newer.group(1)) > generation):
            continue
        target = storage.join(final, top)
        logger.info("removing %s: not part of the checkpoint committed at %s", target, final)
        try:
            if is_prefix:
                storage.remove_tree(target)
            else:
                storage.remove(target)
        except OSError as e:
            logger.warning("could not remove %s: %s", target, e)


def data_path(path: str, storage: Storage) -> str:
    """Where the files of the checkpoint at ``path`` live: ``path/<root>`` for a manifest with a
    root, else ``path`` (also when it holds no readable manifest: the reader reports that)."""
    if not storage.is_object_store:
        return path
    try:
        raw = storage.read_bytes(storage.join(path, MANIFEST_FILE), max_bytes=MANIFEST_MAX_BYTES)
    except OSError:
        return path
    manifest = _parsed(raw)
    return storage.join(path, manifest.root) if manifest is not None and manifest.root else path


# ---------------------------------------------------------------- the index
def index_text(text: str, generation: int | None) -> str:
    """``text`` (an index) naming ``generation`` as its writer (no line when None)."""
    lines = [line for line in text.splitlines() if not _WRITER.fullmatch(line)]
    body = "".join(f"{line}\n" for line in lines)
    return body if generation is None else f"{body}{WRITER_LINE}{int(generation)}\n"


def is_claim_only(text: str) -> bool:
    """Whether the index ``text`` names nothing but its writer (`claim_index` on a logdir
    without checkpoints): readers take it as no index at all."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and all(_WRITER.fullmatch(line) for line in lines)


def index_generation(text: str) -> int | None:
    """The lease generation of the writer that wrote the index ``text`` (None: not recorded)."""
    found = [m for m in map(_WRITER.fullmatch, text.splitlines()) if m]
    return int(found[-1].group(1)) if found else None


def claim_index(storage: Storage, directory: str, index_file: str, generation: int) -> str | None:
    """Rewrites the index with ``generation`` (``If-Match`` the version read) so a paused
    writer's late index write fails its precondition; where there is none, creates one that
    names only its writer (read as no index: `is_claim_only`), so a paused writer's late
    create-only first index fails too. Returns the new version (None: an index that is not
    text, which no writer's ``If-Match`` can name). Call it as the new holder, right after
    taking the lease."""
    path = storage.join(directory, index_file)
    for _ in range(_ATTEMPTS):
        try:
            raw, info = storage.read_versioned(path, max_bytes=_INDEX_MAX_BYTES)
            text = raw.decode("utf-8")
        except FileNotFoundError:
            try:
                return storage.create_exclusive(path, index_text("", generation).encode("utf-8")).version
            except ObjectExistsError:
                continue  # a paused writer's late first index landed in between: claim it
        except (UnicodeDecodeError, OSError) as e:
            logger.warning("not claiming the checkpoint index %s: %s", path, e)
            return None
        try:
            return storage.replace_if(path, index_text(text, generation).encode("utf-8"), info.version).version
        except (PreconditionFailedError, FileNotFoundError):
            continue  # a paused writer's late write landed in between: read it again
    raise OSError(f"the checkpoint index {path} kept changing while this writer took the logdir over")


def older_index_version(storage: Storage, directory: str, index_file: str, generation: int | None) -> str | None:
    """After an index write was refused: the version of the index now there when an older lease
    generation wrote it (a paused writer's late write: the caller replaces it), else None."""
    if generation is None:
        return None
    path = storage.join(directory, index_file)
    try:
        raw, info = storage.read_versioned(path, max_bytes=_INDEX_MAX_BYTES)
        theirs = index_generation(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    if theirs is None or theirs >= generation:
        return None
    logger.warning("the checkpoint index %s was written by a writer that has lost the lease (generation %d; this "
                   "writer's is %d); replacing it", path, theirs, generation)
    return info.version
