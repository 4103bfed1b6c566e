"""Choosing the checkpoint to restore (SPEC §5.4): the index's ``model_checkpoint_path`` (hand
edits honoured, when it names a checkpoint of this logdir), else the highest-step checkpoint; a
candidate that vanishes sends the search back to the index; a candidate that fails verification
is skipped with a WARNING giving the reason and the next older one is tried; if checkpoints
exist and none is usable, `CheckpointCorruptError` lists each and why (never a silent fresh
start). Every candidate is loaded by the one verified loader (`supervisor.checkpoint.load.loader`),
through the logdir's `Storage`: a local directory or an ``s3://`` URL (where a prefix without a
manifest is no checkpoint and is passed over).
"""
from __future__ import annotations

import logging
import os
from typing import Any

from supervisor._validate import check_int
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.layout.fencing import OrphanedManifestError
from supervisor.checkpoint.layout.format import INDEX_FILE, checkpoint_name, list_committed, step_of
from supervisor.checkpoint.layout.index import CheckpointState, entry_problem, read_index
from supervisor.checkpoint.load.loader import LoadedCheckpoint, is_remote, load_verified, resolve_storage, verify_checkpoint
from supervisor.checkpoint.storage import Storage, split_scheme
from supervisor.checkpoint.layout.verify import check_verify
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError, CheckpointVanishedError

__all__ = ["candidates", "choose_checkpoint", "chosen_path", "find_and_load", "load_chosen"]

logger = logging.getLogger(__name__)

#: How many times `find_and_load` looks at the index again after a candidate vanished.
_MAX_RESCANS = 20


def find_and_load(directory: str, basename: str, *, verify: str = "full", unpickling: Unpickling = Unpickling(),
                  mmap: bool = True, storage: Storage | None = None, keep_copy: bool = False) -> LoadedCheckpoint | None:
    """Loads the checkpoint to restore from ``directory``, falling back to older ones.

    A candidate that vanishes while it is read (retention deleted it after a newer commit) is not a
    failure: the index is read again and its new choice tried. Returns None when there is no checkpoint
    at all. ``storage``: the logdir's (default: the one its path or URL names); ``unpickling`` (the
    restorer's allow-list, one record) and ``keep_copy``: as `load_verified`.

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointCorruptError: checkpoints exist but none verifies (each is listed with why).
        CheckpointError: a verified checkpoint needs an untrusted global.
    """
    verify = check_verify(verify)
    storage, directory = resolve_storage(directory, storage)
    failures: dict[str, str] = {}
    orphans: set[str] = set()
    for _ in range(_MAX_RESCANS):
        paths = [p for p in candidates(directory, basename, storage) if p not in failures and p not in orphans]
        for i, path in enumerate(paths):
            try:
                return load_verified(path, verify=verify, unpickling=unpickling, mmap=mmap, storage=storage,
                                     keep_copy=keep_copy)
            except CheckpointVanishedError:
                logger.info("%s was deleted while being read (retention); looking at the index again", path)
                break
            except OrphanedManifestError as e:
                logger.warning("passing over %s", e)  # never a checkpoint: not damage (fencing.py)
                orphans.add(path)
            except (CheckpointNotFoundError, CheckpointCorruptError) as e:
                failures[path] = reason = _reason(e, path)
                nxt = "trying the next older one" if i + 1 < len(paths) else "no older checkpoint left"
                logger.warning("skipping checkpoint %s: %s; %s", path, reason, nxt)
        else:
            break
    if not failures:
        return None
    raise _none_restorable(directory, basename, failures, storage)


def _none_restorable(directory: str, basename: str, failures: dict[str, str], storage: Storage) -> CheckpointCorruptError:
    listing = "; ".join(f"{p}: {r}" for p, r in failures.items())
    return CheckpointCorruptError(
        f"none of the {len(failures)} checkpoint(s) the index allows in {directory} can be restored "
        f"({listing}).{_newer_hint(directory, basename, failures, storage)} Refusing to start from scratch over "
        f"them: repair or move them away, or point the index ({storage.join(directory, INDEX_FILE)}) at a "
        "good one")


def _newer_hint(directory: str, basename: str, failures: dict[str, str], storage: Storage) -> str:
    """Names the checkpoints newer than the failed index choice, which are never jumped to."""
    steps = [step_of(storage.basename(p), basename) for p in failures]
    lowest = min((s for s in steps if s is not None), default=None)
    if lowest is None:
        return ""
    newer = [name for step, name in list_committed(directory, basename, storage)
             if step > lowest and storage.join(directory, name) not in failures]
    if not newer:
        return ""
    return (f" Newer checkpoint(s) exist ({', '.join(newer)}) but the index names an older one (a rollback "
            "by hand?), and a rollback never jumps forward: set model_checkpoint_path to one of them, or "
            "delete the index to restore the newest.")


def choose_checkpoint(directory: str, basename: str, *, verify: str = "full",
                      storage: Storage | None = None) -> tuple[str, int] | None:
    """The checkpoint a restore takes (§5.4), verified but not loaded: the index's checkpoint if
    it verifies, else the next older one; None when there is none. The chief of a sharded job
    runs it before every rank loads; ``prune`` never deletes what it returns.

    Raises:
        CheckpointCorruptError: checkpoints exist but none verifies (each listed with why).
    """
    storage, directory = resolve_storage(directory, storage)
    failures = []
    for path in candidates(directory, basename, storage):
        try:
            manifest = verify_checkpoint(path, verify=verify, storage=storage)
        except OrphanedManifestError as e:
            logger.warning("passing over %s", e)  # never a checkpoint: not damage (fencing.py)
            continue
        except (CheckpointNotFoundError, CheckpointCorruptError) as e:
            logger.warning("skipping checkpoint %s: %s", path, e)
            failures.append(f"{path}: {e}")
            continue
        return path, manifest.step
    if failures:
        raise CheckpointCorruptError(f"none of the checkpoints in {directory} can be restored ({'; '.join(failures)})")
    return None


def candidates(directory: str, basename: str, storage: Storage | None = None) -> list[str]:
    """Paths to try, best first: the index's choice, then older committed directories.

    The index is untrusted (`supervisor.checkpoint.layout.index.entry_problem`): an entry that does not
    name a checkpoint of this logdir is ignored. A hand rollback never jumps forward: when the
    index's choice is missing or damaged, only older checkpoints are tried (`_newer_hint` tells
    the user about the newer ones).
    """
    storage, directory = resolve_storage(directory, storage)
    for _ in range(3):  # the index names a checkpoint retention just deleted: read it again
        committed = _own_committed(directory, basename, storage)
        newest_first = [storage.join(directory, name) for _, name in reversed(committed)]
        primary, problem, index = _index_choice(directory, basename, storage)
        if primary is None or storage.isdir(primary) or _index_choice(directory, basename, storage)[0] == primary:
            break
    if primary is None:
        if committed:
            logger.warning("%s; restoring from the highest-step checkpoint directory %s",
                           problem or f"no checkpoint index in {directory}", committed[-1][1])
        return newest_first
    primary_step = step_of(storage.basename(primary), basename)
    if storage.isdir(primary):
        _warn_unindexed(directory, index, primary_step, committed, storage)  # type: ignore[arg-type]
    return [primary] + [p for p, (step, _) in zip(newest_first, reversed(committed)) if step < primary_step]


def _own_committed(directory: str, basename: str, storage: Storage) -> list[tuple[int, str]]:
    """`list_committed` without symlinks out of the logdir (never restored; WARNING each)."""
    own = []
    for step, name in list_committed(directory, basename, storage):
        problem = entry_problem(directory, name, basename)[1]
        if problem is None:
            own.append((step, name))
        else:
            logger.warning("not restoring %s: %s", storage.join(directory, name), problem)
    return own


def _index_choice(directory: str, basename: str,
                  storage: Storage) -> tuple[str | None, str | None, CheckpointState | None]:
    """``(path the index names or None, why None, the index)``."""
    try:
        index = read_index(directory, storage)
    except (ValueError, OSError) as e:
        return None, str(e), None
    if index is None:
        return None, None, None
    name, why = entry_problem(directory, index.model_checkpoint_path, basename)
    if why is not None:
        return None, (f"the checkpoint index names model_checkpoint_path {index.model_checkpoint_path!r}, "
                      f"which is ignored: {why}"), index
    return storage.join(directory, name), None, index  # type: ignore[arg-type]


def _warn_unindexed(directory: str, index: CheckpointState, primary_step: int, committed: list[tuple[int, str]],
                    storage: Storage) -> None:
    """Names committed checkpoints newer than the index's choice that the index does not list:
    what a failed index update (e.g. ENOSPC) leaves behind. The index stays the authority."""
    listed = {os.path.basename(os.path.normpath(p)) for p in index.all_model_checkpoint_paths}
    newer = [name for step, name in committed if step > primary_step and name not in listed]
    if newer:
        logger.warning("%s: complete checkpoint(s) %s are newer than %s but not in the index (its update "
                       "probably failed, e.g. the disk was full); the index is the authority, so %s is "
                       "restored. To resume from %s instead, set model_checkpoint_path in %s",
                       directory, ", ".join(newer), index.model_checkpoint_path, index.model_checkpoint_path,
                       newer[-1], storage.join(directory, INDEX_FILE))


def _reason(error: Exception, path: str) -> str:
    text = str(error)
    return text[len(path) + 2:] if text.startswith(path + ": ") else text


def chosen_path(directory: str, basename: str, chosen: Any, storage: Storage) -> str:
    """The checkpoint of ``directory`` that ``chosen`` names: a step, or the path of one of its
    checkpoints (``<directory>/<basename>-<step>``; a local path may be relative).

    Raises:
        ValueError: a path that is not a checkpoint of ``directory``.
    """
    if not isinstance(chosen, (str, os.PathLike)):
        return storage.join(directory, checkpoint_name(basename, check_int("step", chosen, minimum=0)))
    path = os.fspath(chosen).rstrip("/")
    if not is_remote(storage):
        path = os.path.abspath(split_scheme(path)[1])
    if storage.dirname(path) != directory or step_of(storage.basename(path), basename) is None:
        raise ValueError(f"{os.fspath(chosen)!r} is not a checkpoint of the logdir {directory} (named "
                         f"{storage.join(directory, basename)}-<step>); pass one of its checkpoints or a step, or "
                         "warm-start from another run with supervisor.restore_partial(<checkpoint>, model) in init_fn")
    return path


def load_chosen(directory: str, basename: str, chosen: Any, *, verify: str = "full",
                unpickling: Unpickling = Unpickling(), storage: Storage | None = None,
                keep_copy: bool = False) -> LoadedCheckpoint:
    """Loads the checkpoint ``chosen`` names (a step, or one of its paths: `chosen_path`),
    verified like every restore; never another one in its place (``unpickling``, ``keep_copy``: as
    `load_verified`).

    Raises:
        CheckpointNotFoundError: no committed checkpoint of that step (the steps there are named).
        CheckpointCorruptError: it fails verification (the other steps are named).
        CheckpointError: it needs an untrusted global.
    """
    storage, directory = resolve_storage(directory, storage)
    path = chosen_path(directory, basename, chosen, storage)
    steps = [step for step, _ in _own_committed(directory, basename, storage)]
    step = step_of(storage.basename(path), basename)
    others = ", ".join(str(s) for s in steps if s != step)
    if step not in steps:
        raise CheckpointNotFoundError(
            f"no checkpoint of step {step} to restore in {directory}: " + (
                f"the steps there are {', '.join(map(str, steps))}; choose one of them" if steps else
                "there is no checkpoint yet"))
    newer = [s for s in steps if s > step]
    if newer:
        logger.warning("restoring the chosen step %d of %s: the newer checkpoint(s) of step %s stay, and each is "
                       "replaced when this run saves that step again (as after `rollback`)", step, directory,
                       ", ".join(map(str, newer)))
    try:
        return load_verified(path, verify=check_verify(verify), unpickling=unpickling, storage=storage,
                             keep_copy=keep_copy)
    except (CheckpointNotFoundError, CheckpointCorruptError) as e:
        raise type(e)(f"the chosen checkpoint {path} cannot be restored: {_reason(e, path)}; "
                      f"{'the other steps there are ' + others if others else 'there is no other checkpoint'}"
                      ) from e
