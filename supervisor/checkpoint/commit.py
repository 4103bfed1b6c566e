"""The commit protocol (SPEC §5.1, steps 2–4): never a partial or corrupt checkpoint.

`write_checkpoint` serialises into ``<name>.tmp-<hex>/state.pt`` (checksummed while writing,
fsynced), seals it with ``MANIFEST.json`` (fsynced, then the directory), renames the directory
to ``<name>/`` and fsyncs the parent. A crash before the rename leaves only a temp directory,
which `clean_transient` removes when a writer next opens the logdir; a crash after it leaves a
complete checkpoint. Publishing it in the index is index.py's job; deleting old ones is
`remove_checkpoint`'s, which renames before it deletes so a reader never sees half a directory.

Deleting: every deleter (retention, ``prune``, ``rollback --discard-newer``) deletes through
`move_aside` / `remove_checkpoint`, which apply the one rule of what may be deleted,
`deletable_problem`: a directory (not a symbolic link) named ``<basename>-<step>`` directly in
the logdir, holding a committed ``MANIFEST.json`` (a regular file). Anything else an index lists
— a user's directory or file, a FIFO, a link — is never renamed or deleted (WARNING).

The temp directory itself (create, fill, seal, rename) is `supervisor.checkpoint.temp`, which
several writers can share (distributed checkpoints); serialisation is
`supervisor.checkpoint.serialize`.
"""
from __future__ import annotations

import logging
import os
import stat
from typing import Any, Callable, Iterable

from supervisor.checkpoint.fileio import Opener, default_opener, fsync_dir
from supervisor.checkpoint.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    deleting_name,
    is_transient,
    transient_base,
)
from supervisor.checkpoint.index import entry_problem
from supervisor.checkpoint.serialize import serialize
from supervisor.checkpoint.temp import CommitResult, TempCheckpoint, remove_tree
from supervisor.checkpoint.verify import check_checkpoint
from supervisor.errors import CheckpointError

__all__ = ["CommitResult", "write_checkpoint", "deletable_problem", "remove_checkpoint", "move_aside", "remove_tree",
           "clean_transient", "recover_interrupted_replacements", "serialize"]

logger = logging.getLogger(__name__)


def write_checkpoint(directory: str, name: str, payload: Any, *, step: int, wall_time: float,
                     world_size: int = 1, opener: Opener | None = None,
                     before_commit: Callable[[], Any] | None = None) -> CommitResult:
    """Writes ``payload`` as the committed checkpoint ``directory/name``; ``before_commit()``
    runs right before the commit (see `TempCheckpoint.finalize`).

    On any error the temp directory is removed and the error re-raised (the caller names the
    step); committed checkpoints are never touched, except a committed ``directory/name`` of
    the same step, which is replaced only once the new one is sealed.
    """
    opener = opener or default_opener  # looked up at call time: fault-injection tests patch it
    temp = TempCheckpoint.create(directory, name)
    try:
        temp.write_file(STATE_FILE, lambda w: serialize(payload, w), opener)
    except BaseException:
        temp.discard()
        raise
    return temp.finalize(step=step, wall_time=wall_time, world_size=world_size, opener=opener,
                         before_commit=before_commit)


def deletable_problem(directory: str, name: str, basename: str | None = None) -> str | None:
    """Why ``directory/name`` must not be deleted as a checkpoint; None when it may be.

    The one rule every deleter applies: ``name`` is ``<basename>-<step>`` (any
    ``<name>-<step>`` without ``basename``) directly inside ``directory`` (`entry_problem`),
    and is a directory — not a symbolic link — holding a committed ``MANIFEST.json`` (a
    regular file). Nothing is opened (a FIFO cannot block this).
    """
    checked, problem = entry_problem(directory, name, basename)
    if problem is not None:
        return problem.replace("it is not a checkpoint name", "not a checkpoint name")
    path = os.path.join(os.path.abspath(directory), checked or name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "it does not exist"
    except OSError as e:
        return f"it cannot be examined ({e})"
    if stat.S_ISLNK(mode):
        return "it is a symbolic link, not a checkpoint directory"
    if not stat.S_ISDIR(mode):
        return "it is not a directory"
    try:
        manifest_mode = os.lstat(os.path.join(path, MANIFEST_FILE)).st_mode
    except OSError:
        return f"it holds no committed {MANIFEST_FILE}"
    if not stat.S_ISREG(manifest_mode):
        return f"it holds no committed {MANIFEST_FILE} (not a regular file)"
    return None


def remove_checkpoint(path: str, basename: str | None = None) -> bool:
    """Deletes a committed checkpoint; returns False when it was already gone or is not a
    checkpoint `deletable_problem` accepts (then it is left as it is, with a WARNING).

    The directory is first renamed to ``<name>.deleting-<hex>`` (`move_aside`, atomic), so a
    reader resolving the name finds either the whole checkpoint or nothing; a reader that
    already opened ``state.pt`` keeps reading it (POSIX keeps unlinked files alive until closed).
    """
    aside = move_aside(path, basename)
    if aside is None:
        return False
    remove_tree(aside)
    return True


def move_aside(path: str, basename: str | None = None) -> str | None:
    """Renames a checkpoint directory to a ``.deleting-`` name; None when it does not exist, or
    is not a checkpoint (`deletable_problem`: then nothing is renamed, with a WARNING)."""
    path = os.path.normpath(path)
    problem = deletable_problem(os.path.dirname(path) or os.curdir, os.path.basename(path), basename)
    if problem == "it does not exist":
        return None
    if problem is not None:
        logger.warning("not deleting %s: %s (only committed checkpoints are ever deleted)", path, problem)
        return None
    aside = os.path.join(os.path.dirname(path), deleting_name(os.path.basename(path)))
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def recover_interrupted_replacements(directory: str, indexed: Iterable[str]) -> list[str]:
    """Puts back a checkpoint the index names but a crash left only under a transient name.

    Re-saving a committed step (`supervisor.checkpoint.temp.rename_into_place`) renames the committed directory to
    ``<name>.deleting-*`` before renaming the sealed ``<name>.tmp-*`` into place, and retention
    moves a checkpoint aside before it rewrites the index; a kill in between leaves the index
    naming ``<name>`` while complete copies sit under transient names. Before those are cleaned
    up, the newest copy that verifies in full (the sealed temp, else the moved-aside one) is
    renamed back to ``<name>``, with a WARNING. Returns the recovered names.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    recovered = []
    for name in dict.fromkeys(indexed):
        if name in names:
            continue
        leftovers = sorted((n for n in names if transient_base(n) == name),
                           key=lambda n: ".tmp-" not in n)  # the newer save first
        for leftover in leftovers:
            path = os.path.join(directory, leftover)
            try:
                check_checkpoint(path, verify="full")
            except CheckpointError as e:
                logger.warning("cannot recover %s from %s: %s", name, path, e)
                continue
            os.rename(path, os.path.join(directory, name))
            fsync_dir(directory)
            logger.warning("recovered %s from %s, left behind when a crash interrupted its replacement "
                           "or deletion", name, leftover)
            recovered.append(name)
            break
    return recovered


def clean_transient(directory: str) -> list[str]:
    """Removes leftover ``*.tmp-*`` / ``*.deleting-*`` entries (a crashed writer's), with a
    WARNING each; returns their names."""
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return removed
    for name in names:
        if not (is_transient(name) or _is_index_temp(name)):
            continue
        path = os.path.join(directory, name)
        logger.warning("removing %s left behind by an interrupted checkpoint write or delete", path)
        if os.path.isdir(path):
            remove_tree(path)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        removed.append(name)
    return removed


def _is_index_temp(name: str) -> bool:
    return name.startswith(INDEX_FILE + ".tmp-")
