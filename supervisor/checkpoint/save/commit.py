"""The commit protocol (SPEC §5.1, §16, steps 2–4): never a partial or corrupt checkpoint.

`write_checkpoint` serialises into a staged checkpoint's ``state.pt`` (checksummed while
writing; fsynced / the upload completed), seals it with ``MANIFEST.json`` written last and makes
it visible (`supervisor.checkpoint.save.temp`, `supervisor.checkpoint.storage.Storage.commit`):
locally a ``<name>.tmp-<hex>/`` directory renamed to ``<name>/``, on an object store the
manifest created with ``If-None-Match: *`` (a checkpoint exists iff its manifest exists). A crash
before that leaves only a temp directory / a manifest-less prefix, which `clean_transient`
removes when a writer next opens the logdir; a crash after it leaves a complete checkpoint.
Publishing it in the index is index.py's job; deleting old ones is `remove_checkpoint`'s, which
makes a checkpoint stop existing in one step before it deletes (`Storage.uncommit`: a rename
locally, the manifest deleted first on an object store) so a reader never sees half of one.

Deleting: every deleter (retention, ``prune``, ``rollback --discard-newer``) deletes through
`move_aside` / `remove_checkpoint`, which apply the one rule of what may be deleted,
`deletable_problem`: a directory (not a symbolic link) named ``<basename>-<step>`` directly in
the logdir, holding a committed ``MANIFEST.json`` (a regular file). Anything else an index lists
— a user's directory or file, a FIFO, a link — is never renamed or deleted (WARNING).

Every filesystem call goes through the logdir's `Storage` (``storage=``; default
`supervisor.checkpoint.storage.storage_for` of the path).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterable

from supervisor.checkpoint.storage.fileio import Opener
from supervisor.checkpoint.layout.format import INDEX_FILE, MANIFEST_FILE, STATE_FILE, is_transient, transient_base
from supervisor.checkpoint.layout.format_registry import writable_format
from supervisor.checkpoint.layout.index import entry_problem
from supervisor.checkpoint.formats.serialize import serialize
from supervisor.checkpoint.storage import Storage, storage_for
from supervisor.checkpoint.save.temp import CommitResult, TempCheckpoint, remove_tree
from supervisor.checkpoint.layout.verify import check_checkpoint
from supervisor.errors import CheckpointError

__all__ = ["CommitResult", "write_checkpoint", "deletable_problem", "remove_checkpoint", "move_aside", "remove_tree",
           "clean_transient", "recover_interrupted_replacements", "serialize"]

logger = logging.getLogger(__name__)


def _storage(path: str, storage: Storage | None) -> Storage:
    return storage if storage is not None else storage_for(path)


def write_checkpoint(directory: str, name: str, payload: Any, *, step: int, wall_time: float,
                     world_size: int = 1, opener: Opener | None = None,
                     storage: Storage | None = None,
                     before_commit: Callable[[], Any] | None = None,
                     generation: int | None = None, checkpoint_format: str = "torch") -> CommitResult:
    """Writes ``payload`` as the committed checkpoint ``directory/name``; ``before_commit()``
    runs right before the commit (see `TempCheckpoint.finalize`); ``generation``: the writer's
    lease generation (fences its files and manifest on an object store: fencing.py).

    On any error the staged checkpoint is removed and the error re-raised (the caller names the
    step); committed checkpoints are never touched, except a committed ``directory/name`` of
    the same step, which is replaced (locally only once the new one is sealed).
    ``opener`` (local directories only): opens each file written, the fault-injection seam.
    ``checkpoint_format``: the registered format whose ``write`` writes the files (`format_registry`).
    """
    fmt = writable_format(checkpoint_format)
    temp = TempCheckpoint.create(directory, name, _storage(directory, storage), generation=generation)
    try:
        fmt.write(payload, lambda file_name, fill: temp.write_file(file_name, fill, opener))  # type: ignore[misc]
    except BaseException:
        temp.discard()
        raise
    return temp.finalize(step=step, wall_time=wall_time, world_size=world_size, opener=opener,
                         before_commit=before_commit)


def deletable_problem(directory: str, name: str, basename: str | None = None,
                      storage: Storage | None = None) -> str | None:
    """Why ``directory/name`` must not be deleted as a checkpoint; None when it may be.

    The one rule every deleter applies: ``name`` is ``<basename>-<step>`` (any
    ``<name>-<step>`` without ``basename``) directly inside ``directory`` (`entry_problem`),
    and is a directory — not a symbolic link — holding a committed ``MANIFEST.json`` (a
    regular file). Nothing is opened (a FIFO cannot block this).
    """
    storage = _storage(directory, storage)
    checked, problem = entry_problem(directory, name, basename)
    if problem is not None:
        return problem.replace("it is not a checkpoint name", "not a checkpoint name")
    local = not storage.is_object_store
    path = storage.join(os.path.abspath(directory) if local else directory, checked or name)
    try:
        kind = storage.entry_kind(path)
        manifest = storage.entry_kind(storage.join(path, MANIFEST_FILE)) if kind == "dir" else None
    except OSError as e:
        return f"it cannot be examined ({e})"
    if kind is None:
        return "it does not exist"
    if kind == "link":
        return "it is a symbolic link, not a checkpoint directory"
    if kind != "dir":
        return "it is not a directory"
    if manifest is None:
        return f"it holds no committed {MANIFEST_FILE}"
    if manifest != "file":
        return f"it holds no committed {MANIFEST_FILE} (not a regular file)"
    return None


def remove_checkpoint(path: str, basename: str | None = None, storage: Storage | None = None) -> bool:
    """Deletes a committed checkpoint; returns False when it was already gone or is not a
    checkpoint `deletable_problem` accepts (then it is left as it is, with a WARNING).

    It first stops being a checkpoint in one step (`move_aside`), so a reader resolving the name
    finds either the whole checkpoint or nothing; a local reader that already opened
    ``state.pt`` keeps reading it (POSIX keeps unlinked files alive until closed).
    """
    storage = _storage(path, storage)
    aside = move_aside(path, basename, storage)
    if aside is None:
        return False
    storage.remove_tree(aside)
    return True


def move_aside(path: str, basename: str | None = None, storage: Storage | None = None) -> str | None:
    """Makes a committed checkpoint stop existing in one step (`Storage.uncommit`: renamed to a
    ``.deleting-`` name locally, its manifest deleted on an object store) and returns where its
    remains are; None when it does not exist, or is not a checkpoint (`deletable_problem`: then
    nothing is touched, with a WARNING)."""
    storage = _storage(path, storage)
    if not storage.is_object_store:
        path = os.path.normpath(path)
    directory = storage.dirname(path) or os.curdir
    problem = deletable_problem(directory, storage.basename(path), basename, storage)
    if problem == "it does not exist":
        return None
    if problem is not None:
        logger.warning("not deleting %s: %s (only committed checkpoints are ever deleted)", path, problem)
        return None
    return storage.uncommit(path)


def recover_interrupted_replacements(directory: str, indexed: Iterable[str],
                                     storage: Storage | None = None) -> list[str]:
    """Puts back a checkpoint the index names but a crash left only under a transient name.

    Re-saving a committed step (`supervisor.checkpoint.storage.local.rename_into_place`) renames
    the committed directory to ``<name>.deleting-*`` before renaming the sealed ``<name>.tmp-*``
    into place, and retention moves a checkpoint aside before it rewrites the index; a kill in
    between leaves the index naming ``<name>`` while complete copies sit under transient names.
    Before those are cleaned up, the newest copy that verifies in full (the sealed temp, else the
    moved-aside one) is renamed back to ``<name>``, with a WARNING. Returns the recovered names.
    On an object store nothing is ever renamed, so there is nothing to recover (no-op).
    """
    storage = _storage(directory, storage)
    if storage.is_object_store:
        return []
    try:
        names = storage.listdir(directory)
    except FileNotFoundError:
        return []
    recovered = []
    for name in dict.fromkeys(indexed):
        if name in names:
            continue
        leftovers = sorted((n for n in names if transient_base(n) == name),
                           key=lambda n: ".tmp-" not in n)  # the newer save first
        for leftover in leftovers:
            if _recover(storage, directory, name, leftover):
                recovered.append(name)
                break
    return recovered


def _recover(storage: Storage, directory: str, name: str, leftover: str) -> bool:
    path = storage.join(directory, leftover)
    try:
        check_checkpoint(path, verify="full")
    except CheckpointError as e:
        logger.warning("cannot recover %s from %s: %s", name, path, e)
        return False
    storage.rename(path, storage.join(directory, name))
    storage.sync_dir(directory)
    logger.warning("recovered %s from %s, left behind when a crash interrupted its replacement "
                   "or deletion", name, leftover)
    return True


def clean_transient(directory: str, storage: Storage | None = None, basename: str | None = None) -> list[str]:
    """Removes what an interrupted writer left, with a WARNING each; returns their names:
    ``*.tmp-*`` / ``*.deleting-*`` entries and index temp files (locally), and — on an object
    store, where a checkpoint is written in place (``storage.stages_in_place``) — every
    ``<basename>-<step>`` prefix without a ``MANIFEST.json`` (an upload that never committed, or
    a deletion that stopped after the manifest) and every unfinished multipart upload under such a
    prefix (a writer killed mid-upload; `ObjectStoreStorage.abort_uploads`). Call it only as the
    logdir's one writer."""
    storage = _storage(directory, storage)
    storage.abort_uploads(directory, lambda name: entry_problem(directory, name, basename)[1] is None)
    try:
        names = storage.listdir(directory)
    except FileNotFoundError:
        return []
    return [name for name in names if _clean_one(storage, directory, name, basename)]


def _clean_one(storage: Storage, directory: str, name: str, basename: str | None) -> bool:
    path = storage.join(directory, name)
    if is_transient(name) or name.startswith(INDEX_FILE + ".tmp-"):
        logger.warning("removing %s left behind by an interrupted checkpoint write or delete", path)
        kind = storage.entry_kind(path)
    elif storage.is_object_store and entry_problem(directory, name, basename)[1] is None \
            and not storage.exists(storage.join(path, MANIFEST_FILE)) and storage.isdir(path):
        logger.warning("removing %s left behind by an interrupted checkpoint write or delete (it holds no %s: "
                       "it never was, or no longer is, a committed checkpoint)", path, MANIFEST_FILE)
        kind = "dir"
    else:
        return False
    if kind == "dir":
        storage.remove_tree(path)
    elif kind is not None:
        storage.remove(path)
    return True
