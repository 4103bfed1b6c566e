"""What a path given on the command line is, and what to pass instead when it is the wrong kind.

A user who types the index file (``LOGDIR/checkpoint``), a file inside a checkpoint
(``.../model.ckpt-200/state.pt``), a checkpoint directory where a log directory is wanted, or
the parent of several log directories (``runs/``) gets one line saying what the path is and the
command to run instead (exit code 2, a usage error). Only names and file types are looked at
(``lstat``/``scandir``): nothing is opened, so a FIFO or a device cannot block the command.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from supervisor.checkpoint import INDEX_FILE, MANIFEST_FILE
from supervisor.checkpoint.layout.format_registry import markers

__all__ = ["PathKind", "path_kind", "is_checkpoint_dir", "find_logdirs", "advice", "NAME_WITH_STEP"]

NAME_WITH_STEP = re.compile(r"^(?P<base>.+)-(?P<step>\d+)$")  # a checkpoint's name: <basename>-<step>
_SCAN_LIMIT = 2000   # directory entries looked at when searching for log directories below a path
_SHOWN = 8           # log directories named in a message


@dataclass(frozen=True)
class PathKind:
    """``kind`` is one of ``missing``, ``logdir`` (any other directory: a log directory, maybe
    without a checkpoint yet), ``logdirs`` (a directory holding no checkpoint of its own but
    log directories below it: ``found``), ``checkpoint`` (a checkpoint directory of the log
    directory ``logdir``), ``index`` (the index file of ``logdir``), ``checkpoint file`` (a file
    of the checkpoint ``checkpoint``), ``file`` (any other non-directory)."""

    path: str
    kind: str
    logdir: str | None = None
    checkpoint: str | None = None
    found: tuple[str, ...] = ()


def _mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode
    except OSError:
        return None


def is_checkpoint_dir(path: str) -> bool:
    """A directory holding a manifest or the marker file of a checkpoint format (``state.pt``,
    ``.metadata``: `supervisor.checkpoint.layout.format_registry`): committed or damaged, not a log directory."""
    return any(_mode(os.path.join(path, f)) is not None for f in (MANIFEST_FILE, *markers()))


def _is_logdir(path: str) -> bool:
    """Has an index, or a checkpoint-named directory with a manifest."""
    if _mode(os.path.join(path, INDEX_FILE)) is not None:
        return True
    try:
        with os.scandir(path) as entries:
            return any(NAME_WITH_STEP.match(e.name) and e.is_dir(follow_symlinks=False)
                       and _mode(os.path.join(e.path, MANIFEST_FILE)) is not None for e in entries)
    except OSError:
        return False


def find_logdirs(path: str, depth: int = 2) -> list[str]:
    """Log directories at most ``depth`` levels below ``path`` (hidden directories, checkpoint
    directories and symlinks are not entered; at most a few thousand entries are looked at)."""
    found, level, seen = [], [path], 0
    for _ in range(depth):
        below = []
        for directory in level:
            try:
                with os.scandir(directory) as entries:
                    children = sorted(e.path for e in entries
                                      if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
            except OSError:
                continue
            seen += len(children)
            for child in children:
                if _is_logdir(child):
                    found.append(child)
                elif not is_checkpoint_dir(child):
                    below.append(child)
            if seen > _SCAN_LIMIT:
                return sorted(found)
        level = below
    return sorted(found)


def path_kind(path: str) -> PathKind:
    """What ``path`` is (see `PathKind`); ``path`` is made absolute."""
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    mode = _mode(path)
    if mode is None:
        return PathKind(path, "missing")
    if not stat.S_ISDIR(mode):
        if os.path.basename(path) == INDEX_FILE:
            return PathKind(path, "index", logdir=parent)
        if is_checkpoint_dir(parent):
            return PathKind(path, "checkpoint file", logdir=os.path.dirname(parent), checkpoint=parent)
        return PathKind(path, "file")
    if is_checkpoint_dir(path):
        return PathKind(path, "checkpoint", logdir=parent, checkpoint=path)
    if not _is_logdir(path):
        found = find_logdirs(path)
        if found:
            return PathKind(path, "logdirs", found=tuple(found))
    return PathKind(path, "logdir", logdir=path)


def _listed(paths: tuple[str, ...]) -> str:
    more = len(paths) - _SHOWN
    return ", ".join(paths[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def advice(found: PathKind, command: str, accepts: tuple[str, ...]) -> str | None:
    """The one-line error for ``command`` given ``found`` (None when ``accepts`` its kind or
    it is missing: each command reports a missing path in its own way)."""
    if found.kind in accepts or found.kind == "missing":
        return None
    p, d, c = found.path, found.logdir, found.checkpoint
    if found.kind == "index":
        return f"{p} is the checkpoint index file of the log directory {d}; run `{command} {d}`"
    if found.kind == "logdirs":
        which = "the log directory" if len(found.found) == 1 else "the log directories"
        return (f"{p} is not a log directory (no checkpoint index, no checkpoint in it); it holds {which} "
                f"{_listed(found.found)}: pass {'it' if len(found.found) == 1 else 'one of them'}")
    if found.kind == "checkpoint file":
        target = c if command in ("verify", "inspect") else d
        return f"{p} is a file of the checkpoint {c}; run `{command} {target}`"
    if found.kind == "checkpoint":
        also = f" (`verify {c}` or `inspect {c}` checks this checkpoint alone)" if command == "ls" else ""
        return f"{p} is a checkpoint directory, not a log directory; run `{command} {d}`{also}"
    what = "a checkpoint directory or a log directory" if command == "verify" else "a log directory"
    tip = " (a torch.save file has no manifest to verify against; `inspect` reads one)" if command == "verify" else ""
    return f"{p} is a file, not {what}{tip}"
