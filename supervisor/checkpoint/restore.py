"""Verify, load and choose checkpoints (SPEC §5.4).

Verification (verify.py) checks what the commit protocol promised: the manifest is there, every
file it lists is a regular file with the recorded size and (``verify="full"``) checksum; a
checkpoint deleted while it is read raises `CheckpointVanishedError`, never "corrupt".

Loading (`load_verified`, and the evaluator's `supervisor.checkpoint.reading.read_checkpoint`)
reads ``state.pt`` once into a sealed private copy in memory, computing its CRC-32 on the way
(`supervisor.checkpoint.private_copy`), and unpickles it only once size and checksum match. A
restore then maps that copy (``torch.load(mmap=True)``): the modules copy their weights straight
from it, with no intermediate copy. The checkpoint file itself is never mapped: a file truncated
while it is mapped kills the process with SIGBUS (issue 21), while a read that comes up short is
reported as damage, and nobody can truncate the sealed copy.

Loading is always ``torch.load(..., weights_only=True)``. A checkpoint that needs another global
is refused with a `CheckpointError` naming the global and the ``trusted_globals=[...]`` opt-in,
which allowlists exactly those (``torch.serialization.safe_globals``) — never a fallback to
unsafe unpickling.

Choosing: the index's ``model_checkpoint_path`` (hand edits honoured, when it names a checkpoint
of this logdir), else the highest-step checkpoint directory; a candidate that vanishes sends
the search back to the index; a candidate that fails is skipped with a WARNING giving the reason and the
next older one is tried; if checkpoints exist and none is usable, `CheckpointCorruptError` lists
each and why.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from supervisor.checkpoint.format import (
    INDEX_FILE,
    RNG_KEY,
    STATE_FILE,
    STEP_KEY,
    Manifest,
    list_committed,
    step_of,
)
from supervisor import distributed, resume
from supervisor.distributed import rng as distributed_rng
from supervisor.checkpoint.fileio import format_checksum, open_regular, open_regular_file
from supervisor.checkpoint.private_copy import PrivateCopy, read_private_copy
from supervisor.checkpoint.index import CheckpointState, entry_problem, read_index
from supervisor.checkpoint.safe_globals import allowed_globals, describe_untrusted, untrusted_message
from supervisor.checkpoint.verify import (
    VERIFY_MODES,
    check_checkpoint,
    check_sizes,
    check_verify,
    checksum_all,
    compare_checksum,
)
from supervisor.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVanishedError,
)
from supervisor.state import TrainingState, unwrap_module

__all__ = ["LoadedCheckpoint", "apply_checkpoint", "check_checkpoint", "check_verify", "choose_checkpoint",
           "find_and_load",
           "load_verified", "safe_torch_load", "VERIFY_MODES"]

logger = logging.getLogger(__name__)

#: How many times `find_and_load` looks at the index again after a candidate vanished.
_MAX_RESCANS = 20
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class Restored:
    """What a restore found: the global step and the checkpoint it came from."""

    global_step: int
    path: str


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint in memory: its path, step, manifest and the ``state.pt`` mapping."""

    path: str
    step: int
    manifest: Manifest
    payload: dict
    mapped: bool = False  # tensors are views of one private copy of state.pt (see load_verified)


def load_verified(path: str, *, verify: str = "full", trusted_globals: Iterable[Any] = (),
                  map_location: Any = "cpu", mmap: bool = False) -> LoadedCheckpoint:
    """Verifies and loads the checkpoint at ``path`` (see the module docstring).

    ``state.pt`` is read once into a private, sealed copy in memory, its CRC-32 computed on the
    way (`supervisor.checkpoint.private_copy`); only when size and checksum match is it
    unpickled (``weights_only``). With ``mmap=True`` (a restore) the tensors are views of that
    private copy (zero further copies; ``mapped``), else they are loaded into tensors of their
    own. Either way they stay valid after the checkpoint is deleted or truncated: the checkpoint
    file itself is never mapped.

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointNotFoundError, CheckpointVanishedError, CheckpointCorruptError: as
            `check_checkpoint`.
        CheckpointError: the checkpoint verifies but needs a global that is not trusted.
    """
    verify = check_verify(verify)
    manifest = check_sizes(path)
    if STATE_FILE not in manifest.files:  # check_sizes: then it is a sharded checkpoint
        check_checkpoint(path, verify=verify)
        raise CheckpointError(f"{path} is a sharded torch.distributed.checkpoint (checkpoint_format="
                              "'dcp'); load it with supervisor.checkpoint.dcp.load_into")
    state_path = os.path.join(path, STATE_FILE)
    others = {name: record for name, record in manifest.files.items() if name != STATE_FILE}
    if verify == "full" and others:
        checksums: dict[str, Any] = {}
        checksum_all(path, dataclasses.replace(manifest, files=others), checksums)
        for name, record in others.items():
            compare_checksum(path, name, record.checksum, checksums.get(name))
    with _read_state(path, manifest, verify) as copy:
        payload, load_error = _load_payload(copy, state_path, map_location, tuple(trusted_globals),
                                            manifest.step, mmap)
        mapped = mmap and copy.path is not None and load_error is None
    if type(load_error) is CheckpointError:  # verified, but needs an untrusted global
        raise load_error
    if load_error is not None:
        error = CheckpointCorruptError(f"{path}: {STATE_FILE} cannot be loaded ({_describe(load_error, state_path)})")
        # torch's unpickling errors advise loading unsafely: never chain (and print) that advice.
        raise error from (None if isinstance(load_error, pickle.UnpicklingError) else load_error)
    if not isinstance(payload, dict):
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} holds a {type(payload).__name__}, not a mapping")
    step = payload.get(STEP_KEY, manifest.step)
    return LoadedCheckpoint(path, int(step), manifest, payload, mapped=mapped)


def _read_state(path: str, manifest: Manifest, verify: str) -> PrivateCopy:
    """``state.pt`` read once into a private copy, size and (``verify="full"``) checksum checked."""
    record = manifest.files[STATE_FILE]
    try:
        fd = open_regular(os.path.join(path, STATE_FILE))
    except OSError as e:
        compare_checksum(path, STATE_FILE, record.checksum, e)  # vanished, or damaged
        raise
    try:
        size = os.fstat(fd).st_size
        if size != record.size:
            raise CheckpointCorruptError(f"{path}: {STATE_FILE} has {size} bytes, the manifest says "
                                         f"{record.size} (truncated or overwritten)")
        copy = read_private_copy(fd, size, f"{path}: {STATE_FILE}", checksum=verify == "full")
    finally:
        os.close(fd)
    if copy.crc is not None and format_checksum(copy.crc) != record.checksum:
        copy.close()
        compare_checksum(path, STATE_FILE, record.checksum, format_checksum(copy.crc))
    return copy


def load_private_copy(copy: PrivateCopy, state_path: str, *, map_location: Any, trusted_globals: Iterable[Any],
                      step: int | None, mmap: bool) -> Any:
    """``torch.load(weights_only=True)`` of a verified private copy of ``state_path`` (named in
    errors): mapped when ``mmap`` and the copy is a memory file holding a zip archive (the only
    format torch maps), else read into tensors of their own."""
    if copy.path is not None:
        mmap = mmap and copy.head(len(_ZIP_MAGIC)) == _ZIP_MAGIC
        return safe_torch_load(copy.path, map_location=map_location, trusted_globals=trusted_globals,
                               step=step, mmap=mmap, shown_as=state_path)
    with copy.open(state_path) as source:
        return safe_torch_load(source, map_location=map_location, trusted_globals=trusted_globals, step=step)


def _load_payload(copy: PrivateCopy, state_path: str, map_location: Any, trusted_globals: tuple,
                  step: int, mmap: bool) -> tuple[Any, Exception | None]:
    """``(payload, None)`` or ``(None, the error)``."""
    try:
        return load_private_copy(copy, state_path, map_location=map_location, trusted_globals=trusted_globals,
                                 step=step, mmap=mmap), None
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways; reported by the caller
        return None, e


def _is_zip(file_path: str) -> bool:
    try:
        with open_regular_file(file_path) as f:
            return f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    except OSError:
        return False


def _describe(error: Exception, file_path: str) -> str:
    """A load error in words that never repeat torch's advice to load unsafely."""
    if isinstance(error, pickle.UnpicklingError):
        reason = _unpickler_reason(str(error))
        zip_note = "" if _is_zip(file_path) else "; it is not a zip archive as torch.save writes"
        return (f"torch.load(weights_only=True) refused it ({reason}){zip_note}: the file needs globals or "
                "pickle operations that are not allowed (a file crafted to run code looks like this), or it "
                "is damaged. torch-supervisor never unpickles unsafely")
    return _strip_unsafe_advice(f"{type(error).__name__}: {error}")


_ADVICE = re.compile(r"[^.\n]*weights_only[`'\s]*(?:set to|=)\s*`?False[^.\n]*\.?", re.IGNORECASE)


def _strip_unsafe_advice(text: str) -> str:
    return _ADVICE.sub("", text).strip()


def _unpickler_reason(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    core = [line for line in lines if not line.startswith(("Weights only load failed", "Check the documentation",
                                                           "Please file an issue"))
            and "weights_only" not in line]
    core = [line.replace("WeightsUnpickler error:", "").strip() for line in core]
    return _strip_unsafe_advice("; ".join(c for c in core if c)) or "an unsupported pickle"


def find_and_load(directory: str, basename: str, *, verify: str = "full",
                  trusted_globals: Iterable[Any] = (), mmap: bool = True) -> LoadedCheckpoint | None:
    """Loads the checkpoint to restore from ``directory``, falling back to older ones.

    A candidate that vanishes while it is read (retention deleted it after a newer commit) is
    not a failure: the index is read again and its new choice tried. Returns None when there is
    no checkpoint at all.

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointCorruptError: checkpoints exist but none verifies (each is listed with why).
        CheckpointError: a verified checkpoint needs an untrusted global.
    """
    verify = check_verify(verify)
    trusted_globals = tuple(trusted_globals)
    failures: dict[str, str] = {}
    for _ in range(_MAX_RESCANS):
        candidates = [p for p in _candidates(directory, basename) if p not in failures]
        for i, path in enumerate(candidates):
            try:
                return load_verified(path, verify=verify, trusted_globals=trusted_globals, mmap=mmap)
            except CheckpointVanishedError:
                logger.info("%s was deleted while being read (retention); looking at the index again", path)
                break
            except (CheckpointNotFoundError, CheckpointCorruptError) as e:
                failures[path] = reason = _reason(e, path)
                nxt = "trying the next older one" if i + 1 < len(candidates) else "no older checkpoint left"
                logger.warning("skipping checkpoint %s: %s; %s", path, reason, nxt)
        else:
            break
    if not failures:
        return None
    listing = "; ".join(f"{p}: {r}" for p, r in failures.items())
    raise CheckpointCorruptError(
        f"none of the {len(failures)} checkpoint(s) the index allows in {directory} can be restored "
        f"({listing}).{_newer_hint(directory, basename, failures)} Refusing to start from scratch over "
        f"them: repair or move them away, or point the index ({os.path.join(directory, INDEX_FILE)}) at a "
        "good one")


def _newer_hint(directory: str, basename: str, failures: dict[str, str]) -> str:
    """Names the checkpoints newer than the failed index choice, which are never jumped to."""
    steps = [step_of(os.path.basename(p), basename) for p in failures]
    lowest = min((s for s in steps if s is not None), default=None)
    if lowest is None:
        return ""
    newer = [name for step, name in list_committed(directory, basename)
             if step > lowest and os.path.join(directory, name) not in failures]
    if not newer:
        return ""
    return (f" Newer checkpoint(s) exist ({', '.join(newer)}) but the index names an older one (a rollback "
            "by hand?), and a rollback never jumps forward: set model_checkpoint_path to one of them, or "
            "delete the index to restore the newest.")


# ---------------------------------------------------------------- candidates
def choose_checkpoint(directory: str, basename: str, *, verify: str = "full") -> tuple[str, int] | None:
    """The checkpoint a restore takes (§5.4), verified but not loaded: the index's checkpoint if
    it verifies, else the next older one; None when there is none. The chief of a sharded job
    runs it before every rank loads; ``prune`` never deletes what it returns.

    Raises:
        CheckpointCorruptError: checkpoints exist but none verifies (each listed with why).
    """
    failures = []
    for path in _candidates(directory, basename):
        try:
            manifest = check_checkpoint(path, verify=verify)
        except (CheckpointNotFoundError, CheckpointCorruptError) as e:
            logger.warning("skipping checkpoint %s: %s", path, e)
            failures.append(f"{path}: {e}")
            continue
        return path, manifest.step
    if failures:
        raise CheckpointCorruptError(f"none of the checkpoints in {directory} can be restored ({'; '.join(failures)})")
    return None


def _candidates(directory: str, basename: str) -> list[str]:
    """Paths to try, best first: the index's choice, then older committed directories.

    The index is untrusted (`supervisor.checkpoint.index.entry_problem`): an entry that does not
    name a checkpoint of this logdir is ignored. A hand rollback never jumps forward: when the
    index's choice is missing or damaged, only older checkpoints are tried (`_newer_hint` tells
    the user about the newer ones).
    """
    for _ in range(3):  # the index names a checkpoint retention just deleted: read it again
        committed = _own_committed(directory, basename)
        newest_first = [os.path.join(directory, name) for _, name in reversed(committed)]
        primary, problem, index = _index_choice(directory, basename)
        if primary is None or os.path.isdir(primary) or _index_choice(directory, basename)[0] == primary:
            break
    if primary is None:
        if committed:
            logger.warning("%s; restoring from the highest-step checkpoint directory %s",
                           problem or f"no checkpoint index in {directory}", committed[-1][1])
        return newest_first
    primary_step = step_of(os.path.basename(primary), basename)
    if os.path.isdir(primary):
        _warn_unindexed(directory, index, primary_step, committed)
    return [primary] + [p for p, (step, _) in zip(newest_first, reversed(committed)) if step < primary_step]


def _own_committed(directory: str, basename: str) -> list[tuple[int, str]]:
    """`list_committed` without symlinks out of the logdir (never restored; WARNING each)."""
    own = []
    for step, name in list_committed(directory, basename):
        problem = entry_problem(directory, name, basename)[1]
        if problem is None:
            own.append((step, name))
        else:
            logger.warning("not restoring %s: %s", os.path.join(directory, name), problem)
    return own


def _index_choice(directory: str, basename: str) -> tuple[str | None, str | None, CheckpointState | None]:
    """``(path the index names or None, why None, the index)``."""
    try:
        index = read_index(directory)
    except (ValueError, OSError) as e:
        return None, str(e), None
    if index is None:
        return None, None, None
    name, why = entry_problem(directory, index.model_checkpoint_path, basename)
    if why is not None:
        return None, (f"the checkpoint index names model_checkpoint_path {index.model_checkpoint_path!r}, "
                      f"which is ignored: {why}"), index
    return os.path.join(directory, name), None, index


def _warn_unindexed(directory: str, index: CheckpointState, primary_step: int,
                    committed: list[tuple[int, str]]) -> None:
    """Names committed checkpoints newer than the index's choice that the index does not list:
    what a failed index update (e.g. ENOSPC) leaves behind. The index stays the authority."""
    listed = {os.path.basename(os.path.normpath(p)) for p in index.all_model_checkpoint_paths}
    newer = [name for step, name in committed if step > primary_step and name not in listed]
    if newer:
        logger.warning("%s: complete checkpoint(s) %s are newer than %s but not in the index (its update "
                       "probably failed, e.g. the disk was full); the index is the authority, so %s is "
                       "restored. To resume from %s instead, set model_checkpoint_path in %s",
                       directory, ", ".join(newer), index.model_checkpoint_path, index.model_checkpoint_path,
                       newer[-1], os.path.join(directory, INDEX_FILE))


def _reason(error: Exception, path: str) -> str:
    text = str(error)
    return text[len(path) + 2:] if text.startswith(path + ": ") else text


# ---------------------------------------------------------------- loading
def safe_torch_load(file_path: Any, *, map_location: Any = "cpu", trusted_globals: Iterable[Any] = (),
                    step: int | None = None, mmap: bool = False, shown_as: str | None = None) -> Any:
    """``torch.load(file_path, weights_only=True)`` with ``trusted_globals`` allowlisted.
    ``shown_as`` names the file in messages (a private copy's ``/proc/self/fd/N`` path means
    nothing to the user).

    Raises:
        CheckpointError: the file needs another global; names it and the opt-in.
        Exception: whatever ``torch.load`` raises for a damaged file.
    """
    trusted_globals = list(trusted_globals)
    try:
        with torch.serialization.safe_globals(allowed_globals(trusted_globals)):
            return torch.load(file_path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # Every missing global at once, with the state entries using it (safe_globals.py).
        missing = describe_untrusted(file_path, e, trusted_globals)
        if not missing:
            raise
        # torch's message advises unsafe loading: never chained, never repeated
        raise CheckpointError(untrusted_message(shown_as or file_path, step, missing)) from None


# ---------------------------------------------------------------- applying
def apply_checkpoint(loaded: LoadedCheckpoint, state: TrainingState, *, restore_rng: bool = True,
                     strict: bool = True) -> Restored:
    """Loads a verified checkpoint into ``state`` (strict by default) and, with ``restore_rng``,
    this rank's RNG states; returns what the session needs to continue.

    Raises:
        CheckpointError: the checkpoint does not fit the state; names the path and step.
    """
    payload = _materialize_non_modules(loaded.payload, state) if loaded.mapped else loaded.payload
    where = f"{loaded.path} (step {loaded.step})"
    live = resume.live_iterators(state)  # exact resume (supervisor/resume.py): checked before the load
    try:
        state.load_state_dict(payload, strict=strict)
    except CheckpointError as e:
        raise CheckpointError(f"restoring {loaded.path} (step {loaded.step}) failed: {e}") from e
    resume.prime_loaders(state, live, where)  # exact resume: may draw from the RNG, so before it
    if restore_rng:
        rank = distributed.rank()
        states = loaded.payload.get(RNG_KEY)
        if isinstance(states, dict) and rank in states:
            resume.restore_rng(states[rank], state, where=where)  # + the loaders' generators
        elif isinstance(states, dict) and states:  # the world size changed: a derived seed (§12)
            distributed_rng.restore_for_rank(states, rank, step=loaded.step, where=where)
        else:
            logger.warning("%s has no RNG state (saved with save_rng=False?); the random generators "
                           "continue from their current state", loaded.path)
    return Restored(global_step=loaded.step, path=loaded.path)


def _materialize_non_modules(payload: dict, state: TrainingState) -> dict:
    """Copies the mapped tensors of entries that are not modules into memory.

    Modules copy what they load into their own parameters, so they read the mapped file once
    and keep nothing. Other objects (an optimizer's moments, for one) keep the tensors they are
    given: left mapped, they would pin the checkpoint file, and its disk space, after retention
    deletes it.
    """
    out = dict(payload)
    for name, obj in state.items():
        if name in out and not isinstance(unwrap_module(obj), torch.nn.Module):
            out[name] = _copy_tensors(out[name])
    return out


def _copy_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        copied = type(value)((k, _copy_tensors(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            copied._metadata = value._metadata  # type: ignore[attr-defined]
        return copied
    if type(value) in (list, tuple):
        return type(value)(_copy_tensors(v) for v in value)
    return value
