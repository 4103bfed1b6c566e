"""The index file ``logdir/checkpoint`` (SPEC §5.3), in TensorFlow's text format.

::

    model_checkpoint_path: "model.ckpt-200"
    all_model_checkpoint_paths: "model.ckpt-100"
    all_model_checkpoint_paths: "model.ckpt-200"
    all_model_checkpoint_timestamps: 1763700000.5
    all_model_checkpoint_timestamps: 1763700600.1
    last_preserved_timestamp: 1763699000.0

A writer that keeps the best checkpoints or every N-th step (``keep_best``/``keep_period``)
also records its rule and each listed checkpoint's metric (``nan``: none), so a restart keeps the
same ones and ``ls`` says why each is kept::

    all_model_checkpoint_metrics: 0.25
    all_model_checkpoint_metrics: nan
    max_to_keep: 1
    keep_best: 2
    best_mode: "min"
    best_metric: "loss"

Paths are written relative to the logdir, oldest first; ``model_checkpoint_path`` is what a
restore picks, and a person may edit it by hand to restart from an older checkpoint. The file is
rewritten atomically through the logdir's `supervisor.checkpoint.storage.Storage` (locally: temp
file, fsync, ``os.replace``, fsync of the directory; on an object store one ``PutObject``), so a
reader always sees the old or the new index, never a mix. A writer replaces it only while it still
is the version it read (`replace_index`: ``If-Match`` on the ETag on an object store), so two
writers can never both move it.

Because anyone can edit it, the index is untrusted input: retention and restore act only on
entries that name a checkpoint of this logdir (`entry_problem`: ``<basename>-<step>``, directly
inside the logdir, no ``..``, no absolute path elsewhere, no symlink out of it). Every other
entry is ignored with a WARNING — never deleted, never loaded.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from supervisor.checkpoint.layout.fencing import index_text, is_claim_only
from supervisor.checkpoint.storage.fileio import NotARegularFileError
from supervisor.checkpoint.layout.format import INDEX_FILE, MANIFEST_FILE, step_of
from supervisor.checkpoint.storage import LocalStorage, ObjectInfo, Storage, is_url, split_scheme, storage_for

__all__ = ["CheckpointState", "get_checkpoint_state", "latest_checkpoint", "read_index", "write_index", "replace_index",
           "parse_index", "format_index", "relative_index", "trusted_index", "entry_problem",
           "EmptyIndexError", "keep_entries"]

logger = logging.getLogger(__name__)

_LINE = re.compile(r"^\s*([A-Za-z_]+)\s*:\s*(.*?)\s*$")
_STRING_KEYS = ("model_checkpoint_path", "all_model_checkpoint_paths", "best_mode", "best_metric")
_FLOAT_KEYS = ("all_model_checkpoint_timestamps", "last_preserved_timestamp", "all_model_checkpoint_metrics")
_INT_KEYS = ("max_to_keep", "keep_best", "keep_period")  # the retention rule, when it goes beyond TF's
_INDEX_MAX_BYTES = 16 << 20  # a text file of checkpoint names: never this large
_ANY_CHECKPOINT_NAME = re.compile(r"[^./\\][^/\\]*-\d+")


class EmptyIndexError(ValueError):
    """The index file exists but names no ``model_checkpoint_path`` (TF raises ValueError)."""


@dataclass(frozen=True)
class CheckpointState:
    """The index's content (TF's ``CheckpointState`` proto).

    Attributes:
        model_checkpoint_path: the checkpoint to restore from.
        all_model_checkpoint_paths: the checkpoints retention manages, oldest first.
        all_model_checkpoint_timestamps: when each of those was saved (seconds since the epoch).
        last_preserved_timestamp: when the last checkpoint kept by
            ``keep_checkpoint_every_n_hours`` was saved (None when never written).
        all_model_checkpoint_metrics: each listed checkpoint's metric (NaN: none), written by a
            writer with ``keep_best``; empty otherwise.
        max_to_keep, keep_best, keep_period, best_mode, best_metric: the retention rule of a
            writer with ``keep_best`` or ``keep_period`` (None otherwise).
        version: the version of the index file it was read from (`read_index`; the ETag on
            an object store), which `replace_index` requires; not part of its value.
    """

    model_checkpoint_path: str
    all_model_checkpoint_paths: tuple[str, ...] = ()
    all_model_checkpoint_timestamps: tuple[float, ...] = ()
    last_preserved_timestamp: float | None = None
    all_model_checkpoint_metrics: tuple[float, ...] = ()
    max_to_keep: int | None = None
    keep_best: int | None = None
    keep_period: int | None = None
    best_mode: str | None = None
    best_metric: str | None = None
    version: str | None = field(default=None, compare=False, repr=False)


def parse_index(text: str) -> CheckpointState:
    """Parses the text format; `ValueError` names the offending line."""
    values: dict[str, list] = {key: [] for key in _STRING_KEYS + _FLOAT_KEYS + _INT_KEYS}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None or match.group(1) not in values:
            raise ValueError(f"line {number} is not a checkpoint index field: {line!r}")
        key, raw = match.groups()
        try:
            values[key].append(_unquote(raw) if key in _STRING_KEYS else int(raw) if key in _INT_KEYS else float(raw))
        except ValueError as e:
            raise ValueError(f"line {number} ({key}) has a malformed value {raw!r}: {e}") from e
    latest = values["model_checkpoint_path"]
    if not latest or not latest[-1]:
        raise EmptyIndexError("it names no model_checkpoint_path")
    last = {key: values[key][-1] if values[key] else None
            for key in ("last_preserved_timestamp", "best_mode", "best_metric") + _INT_KEYS}
    return CheckpointState(
        model_checkpoint_path=latest[-1],
        all_model_checkpoint_paths=tuple(values["all_model_checkpoint_paths"]),
        all_model_checkpoint_timestamps=tuple(values["all_model_checkpoint_timestamps"]),
        all_model_checkpoint_metrics=tuple(values["all_model_checkpoint_metrics"]), **last)


def format_index(state: CheckpointState) -> str:
    lines = [f"model_checkpoint_path: {_quote(state.model_checkpoint_path)}"]
    lines += [f"all_model_checkpoint_paths: {_quote(p)}" for p in state.all_model_checkpoint_paths]
    lines += [f"all_model_checkpoint_timestamps: {float(t)!r}" for t in state.all_model_checkpoint_timestamps]
    if state.last_preserved_timestamp is not None:
        lines.append(f"last_preserved_timestamp: {float(state.last_preserved_timestamp)!r}")
    lines += [f"all_model_checkpoint_metrics: {float(m)!r}" for m in state.all_model_checkpoint_metrics]
    lines += [f"{key}: {getattr(state, key)}" for key in _INT_KEYS if getattr(state, key) is not None]
    lines += [f"{key}: {_quote(getattr(state, key))}" for key in ("best_mode", "best_metric")
              if getattr(state, key) is not None]
    return "\n".join(lines) + "\n"


def read_index(directory: str, storage: Storage | None = None) -> CheckpointState | None:
    """The index as written (paths as they are in the file, ``version`` the version read);
    None when there is no index file, or one naming only the lease holder that claimed it
    (`supervisor.checkpoint.layout.fencing.claim_index`). ``storage``: the logdir's (default `storage_for`).

    Raises:
        ValueError: the file exists but cannot be parsed, or is not a regular file (the message
            names the file).
        OSError: the file exists but cannot be read.
    """
    storage = storage if storage is not None else storage_for(directory)
    path = storage.join(directory, INDEX_FILE)
    try:
        data, info = storage.read_versioned(path)  # regular files only: never blocks on a FIFO
        text = data.decode("utf-8")
    except FileNotFoundError:
        return None
    except (NotARegularFileError, IsADirectoryError) as e:
        raise ValueError(f"the checkpoint index {e}" if isinstance(e, NotARegularFileError) else
                         f"the checkpoint index {path} is not a regular file (a directory)") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"the checkpoint index {path} is not text: {e}") from e
    if is_claim_only(text):  # a new lease holder's claim before its first checkpoint (fencing.py)
        return None
    try:
        return replace(parse_index(text), version=info.version)
    except EmptyIndexError as e:
        raise EmptyIndexError(f"the checkpoint index {path} is unreadable: {e}") from e
    except ValueError as e:
        raise ValueError(f"the checkpoint index {path} is unreadable: {e}") from e


def write_index(directory: str, state: CheckpointState, storage: Storage | None = None) -> ObjectInfo:
    """Atomically replaces ``directory/checkpoint`` with ``state``, whatever is there (the CLI's
    rollback and prune; a training writer uses `replace_index`)."""
    storage = storage if storage is not None else storage_for(directory)
    return storage.write_atomic(storage.join(directory, INDEX_FILE), format_index(state).encode("utf-8"))


def replace_index(directory: str, state: CheckpointState, *, storage: Storage, version: str | None,
                  generation: int | None = None) -> ObjectInfo:
    """Replaces ``directory/checkpoint`` with ``state`` only while it still is ``version`` (the
    version the writer read or last wrote; None: only if there is no index yet) and returns the
    new version. ``generation``: the writer's lease generation, recorded in a comment line
    (`supervisor.checkpoint.layout.fencing.index_text`).

    Raises:
        PreconditionFailedError: another writer replaced (or created) the index meanwhile;
            nothing was written (`supervisor.checkpoint.storage.ObjectExistsError` when one
            was created where ``version`` is None).
        FileNotFoundError: the index was deleted meanwhile.
    """
    path = storage.join(directory, INDEX_FILE)
    data = index_text(format_index(state), generation).encode("utf-8")
    if version is None:
        return storage.create_exclusive(path, data)
    return storage.replace_if(path, data, version)


def get_checkpoint_state(checkpoint_dir: str | os.PathLike) -> CheckpointState | None:
    """The index of ``checkpoint_dir`` with absolute paths, or None (TF's semantics: a missing
    or unreadable index gives None, the latter with a WARNING).

    Raises:
        ValueError: the index exists but names no ``model_checkpoint_path`` (e.g. it is empty),
            as TF's ``get_checkpoint_state`` does.
    """
    directory = os.fspath(checkpoint_dir)
    try:
        state = read_index(directory)
    except EmptyIndexError as e:
        raise ValueError(f"invalid checkpoint state loaded from {directory}: {e}") from e
    except (ValueError, OSError) as e:
        logger.warning("%s; checkpoint index ignored", e)
        return None
    if state is None:
        return None
    absolute = lambda p: p if os.path.isabs(p) else os.path.join(directory, p)  # noqa: E731
    return replace(state, model_checkpoint_path=absolute(state.model_checkpoint_path),
                   all_model_checkpoint_paths=tuple(absolute(p) for p in state.all_model_checkpoint_paths))


def latest_checkpoint(checkpoint_dir: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None,
                      storage: Storage | None = None) -> str | None:
    """The path of the checkpoint the index names, if it exists (committed); else None.

    Like TF, this reads the index only and does not verify checksums;
    `supervisor.checkpoints_iterator` yields verified checkpoints only. An index that names
    something other than a checkpoint directly inside ``checkpoint_dir`` gives None, with a
    WARNING (see `entry_problem`); so does an empty index. ``checkpoint_dir`` may be an
    ``s3://bucket/prefix`` URL (``storage_options``: the client's options); the URL of the
    checkpoint is returned then, if its manifest exists (``storage``: that URL's storage, made
    once by the caller).
    """
    scheme, spelled = split_scheme(checkpoint_dir)
    if scheme == "file":
        storage = None
    elif storage is None:
        storage = storage_for(spelled, storage_options)
    directory = os.path.abspath(spelled) if storage is None else spelled.rstrip("/")
    try:
        state = read_index(directory, storage if storage is not None else LocalStorage())
    except (ValueError, OSError) as e:
        logger.warning("%s; checkpoint index ignored", e)
        return None
    if state is None:
        return None
    name, problem = entry_problem(directory, state.model_checkpoint_path)
    if problem is not None:
        logger.warning("ignoring the checkpoint index entry model_checkpoint_path %r of %s: %s",
                       state.model_checkpoint_path, directory, problem)
        return None
    if storage is not None:
        path = storage.join(directory, name)
        return path if storage.exists(storage.join(path, MANIFEST_FILE)) else None
    path = os.path.join(directory, name)
    return path if os.path.isfile(os.path.join(path, MANIFEST_FILE)) else None


def entry_problem(directory: str, entry: str, basename: str | None = None) -> tuple[str | None, str | None]:
    """Checks an index entry as untrusted input: ``(name, None)`` when it names a checkpoint
    directly inside ``directory`` (``name`` relative to it), else ``(None, why not)``.

    An entry qualifies when it is ``<basename>-<step>`` (any ``<name>-<step>`` without
    ``basename``), relative or absolute, its parent is ``directory`` itself (no ``..``, no
    subdirectory, no other directory) and, if it is a symbolic link, it points to a directory
    inside ``directory``.
    """
    if not isinstance(entry, str) or not entry or "\0" in entry:
        return None, "it is empty or not a path"
    if is_url(directory):
        return _url_entry_problem(directory, entry, basename)
    directory = os.path.abspath(directory)
    normalized = os.path.normpath(entry)
    if os.path.isabs(normalized):
        parent, name = os.path.split(normalized)
        if os.path.realpath(parent) != os.path.realpath(directory):
            return None, f"it is outside the logdir {directory}"
    else:
        name = normalized
        if os.sep in name or (os.altsep and os.altsep in name) or name in (os.curdir, os.pardir):
            return None, "it is not directly inside the logdir (no '..' or subdirectories)"
    problem = _name_problem(name, basename)
    if problem is not None:
        return None, problem
    full = os.path.join(directory, name)
    if os.path.islink(full):
        target = os.path.realpath(full)
        if os.path.dirname(target) != os.path.realpath(directory):
            return None, f"it is a symbolic link out of the logdir (to {target})"
    return name, None


def _name_problem(name: str, basename: str | None) -> str | None:
    if basename is not None and step_of(name, basename) is None:
        return f"it is not a checkpoint name of the form {basename}-<step>"
    if basename is None and not _ANY_CHECKPOINT_NAME.fullmatch(name):
        return "it is not a checkpoint name of the form <basename>-<step>"
    return None


def _url_entry_problem(directory: str, entry: str, basename: str | None) -> tuple[str | None, str | None]:
    """`entry_problem` for an object-store logdir (a URL): an entry is a name directly under
    it, or the full URL of one (an object store has no links and no ``..``)."""
    prefix = directory.rstrip("/") + "/"
    if "://" in entry:
        if not entry.startswith(prefix):
            return None, f"it is outside the logdir {directory}"
        entry = entry[len(prefix):]
    name = entry.rstrip("/")
    if not name or "/" in name or "\\" in name or name in (os.curdir, os.pardir):
        return None, "it is not directly inside the logdir (no '..' or subdirectories)"
    problem = _name_problem(name, basename)
    return (None, problem) if problem is not None else (name, None)


def trusted_index(index: CheckpointState, directory: str, basename: str, *,
                  warn: bool = True) -> tuple[CheckpointState, list[str]]:
    """The index with only the entries `entry_problem` accepts, as names relative to
    ``directory``; every other entry is logged (WARNING) and left out, so retention never
    deletes and restore never loads it. Returns the index and the names of the entries left
    out. An unacceptable ``model_checkpoint_path`` becomes ``""``."""
    ignored: list[str] = []

    def accept(field_name: str, entry: str) -> str | None:
        name, problem = entry_problem(directory, entry, basename)
        if problem is not None:
            ignored.append(entry)
        if problem is not None and warn:
            logger.warning("ignoring the checkpoint index entry %s %r in %s: %s; it is never deleted "
                           "or restored", field_name, entry, os.path.join(directory, INDEX_FILE), problem)
        return name

    latest = accept("model_checkpoint_path", index.model_checkpoint_path) or ""
    kept = [(n, i) for i, p in enumerate(index.all_model_checkpoint_paths)
            if (n := accept("all_model_checkpoint_paths", p)) is not None]
    return keep_entries(replace(index, model_checkpoint_path=latest), kept), ignored


def keep_entries(index: CheckpointState, kept: list[tuple[str, int]]) -> CheckpointState:
    """``index`` listing only ``kept`` (name, position in the list), with their timestamps and
    metrics when the index has one per listed path (so every rewrite keeps them aligned)."""
    count = len(index.all_model_checkpoint_paths)

    def parallel(values: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(values[i] for _, i in kept) if len(values) == count else ()
    return replace(index, all_model_checkpoint_paths=tuple(n for n, _ in kept),
                   all_model_checkpoint_timestamps=parallel(index.all_model_checkpoint_timestamps),
                   all_model_checkpoint_metrics=parallel(index.all_model_checkpoint_metrics))


def relative_index(index: CheckpointState, directory: str) -> CheckpointState:
    """The index's managed paths relative to ``directory``. Entries that do not name a
    checkpoint directly inside it (`entry_problem`, any basename) are left out with a WARNING,
    so nothing that acts on the result (retention, pruning) can touch them. Prefer
    `trusted_index`, which also checks the basename."""
    directory = os.path.abspath(directory)
    kept = []
    for i, path in enumerate(index.all_model_checkpoint_paths):
        name, problem = entry_problem(directory, path)
        if problem is None:
            kept.append((name, i))
        else:
            logger.warning("ignoring the checkpoint index entry all_model_checkpoint_paths %r in %s: %s",
                           path, os.path.join(directory, INDEX_FILE), problem)
    return keep_entries(index, kept)


# ---------------------------------------------------------------- text-format strings
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _unquote(raw: str) -> str:
    if len(raw) < 2 or raw[0] != raw[-1] or raw[0] not in "\"'":
        raise ValueError("expected a quoted string")
    body, out, i = raw[1:-1], [], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        nxt = body[i + 1:i + 2]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif re.match(r"[0-7]{3}", body[i + 1:i + 4]):
            out.append(chr(int(body[i + 1:i + 4], 8)))
            i += 4
        else:
            raise ValueError(f"unknown escape \\{nxt}")
    return "".join(out)
