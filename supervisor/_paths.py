"""Directory arguments, checked once for every constructor that takes one (messages name the
argument, the value and the fix).

`check_path` is the type check every directory argument gets. `check_logdir` is for a log or
checkpoint directory a session will write: it also refuses, at construction, what would fail
or do harm later — a path that is a file, a path that cannot be created (under a file, or
without write permission on its nearest existing ancestor), and a checkpoint directory itself
(``runs/x/model.ckpt-2``: training there would start from scratch and write a new run inside a
sealed checkpoint). Nothing is created here.

A ``file://`` URL is its local path (``file:///abs/run`` → ``/abs/run``), checked and returned as
such; a misspelt URL (``s3:/bucket/x``, ``S3://...``, ``file://relative``) is a `ValueError` naming
the spelling to use (`supervisor.checkpoint.storage.check_url_spelling`: one rule for every entry
point). An object-store URL (``s3://bucket/prefix``, SPEC §16) is returned as given, never made absolute
or looked up on the local disk: `check_logdir` checks its scheme and client instead (an unknown
scheme is a `ValueError` naming it, a missing optional client an `ImportError` naming the pip
extra) and builds no connection; the first request says what else is wrong (credentials,
bucket). ``storage_options`` (the object-store client's options) are refused for a local path.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

from supervisor._validate import check_int, check_path, check_watched_directory  # re-exported: checkpoint/ imports them there
# re-exported: the storage seam owns them
from supervisor.checkpoint.storage import Location, check_location, check_storage, is_url, split_scheme

__all__ = ["check_directory", "check_logdir", "check_path", "check_restore_step", "check_storage",
           "check_watched_directory", "is_url", "local_path", "locate_logdir"]

# The checkpoint format's own files (supervisor/checkpoint/layout/format.py: MANIFEST_FILE, STATE_FILE).
_CHECKPOINT_FILES = ("MANIFEST.json", "state.pt")


def check_directory(name: str, value: Any, *, allow_none: bool = True) -> str | None:
    """`check_path`, then `ValueError` for a path that exists and is not a directory (it need not
    exist yet: it is created on first use).

    Examples:
        >>> check_directory("output_dir", "runs/profile")
        'runs/profile'
        >>> check_directory("output_dir", None) is None
        True
    """
    path = local_path(check_path(name, value, allow_none=allow_none))
    if path is not None and not is_url(path) and os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {path!r} exists and is not a directory; pass a directory (it is created "
                         "if missing) or remove that file")
    return path


def check_logdir(name: str, value: Any, *, allow_none: bool = True, writable: bool = True,
                 hint: str = "", storage_options: Mapping[str, Any] | None = None) -> str | None:
    """`check_path`, then refuses a file, a checkpoint directory and (``writable``) a path that
    cannot be created or written, with `ValueError`; a URL gets `check_storage` instead (see
    the module docstring). The checked path of `locate_logdir`'s location.

    Examples:
        >>> check_logdir("checkpoint_dir", "file:///tmp/run")
        '/tmp/run'
        >>> check_logdir("checkpoint_dir", 7)
        Traceback (most recent call last):
        TypeError: checkpoint_dir must be a directory path or None, got 7
    """
    location = locate_logdir(name, value, allow_none=allow_none, writable=writable, hint=hint,
                             storage_options=storage_options)
    return None if location is None else location.path


def locate_logdir(name: str, value: Any, *, allow_none: bool = True, writable: bool = True,
                  hint: str = "", storage_options: Mapping[str, Any] | None = None) -> Location | None:
    """`check_logdir`'s checks, returning the directory's `Location`: the checked path and its
    storage, resolved once here (a front door passes it inward instead of ``storage_options``)."""
    if isinstance(value, Location) and storage_options is None:
        return value
    path = local_path(check_path(name, value, allow_none=allow_none, hint=hint))
    location = check_location(name, path, storage_options)
    if location is None:
        return None
    if is_url(path):  # as the checkpoint manager spells it: no trailing "/"
        scheme, rest = path.split("://", 1)
        if not rest.strip("/"):
            raise ValueError(f"{name} {path!r} names no bucket; use {scheme}://<bucket>/<prefix>")
        return location
    _check_local_logdir(name, path, writable=writable)
    return Location(path, location.storage)


def _check_local_logdir(name: str, path: str, *, writable: bool) -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} {path!r} exists and is not a directory; choose another path")
    marker = next((f for f in _CHECKPOINT_FILES if os.path.isfile(os.path.join(path, f))), None)
    if marker is not None:
        parent = os.path.dirname(os.path.abspath(path))
        raise ValueError(f"{name} {path!r} is a checkpoint directory (it holds {marker}), not a log directory; "
                         f"pass the directory that holds the checkpoints, {parent!r}, to resume from them")
    if writable:
        _check_creatable(name, path)


def local_path(value: Any) -> Any:
    """The local path a ``file://`` URL names; any other value as it is (a URL, a local path, a
    value of the wrong type left to the caller's check). `ValueError` for a misspelt URL.

    Examples:
        >>> local_path("file:///tmp/run")
        '/tmp/run'
        >>> local_path("s3://bucket/run")
        's3://bucket/run'
    """
    if not isinstance(value, (str, os.PathLike)) or not isinstance(os.fspath(value), str):
        return value
    scheme, spelled = split_scheme(value)
    return spelled if scheme == "file" and spelled != os.fspath(value) else value


def check_restore_step(value: Any, logdir: str | None, basename: str) -> int | str | None:
    """``restore_step=``: None, a step (an integer >= 0), or the path of a checkpoint of ``logdir``
    (``<logdir>/<basename>-<step>``, returned absolute; a URL as given). Whether that checkpoint
    exists and verifies is the restore's question (it names the steps there)."""
    if value is not None and logdir is None:
        raise ValueError(f"restore_step={value!r} was given without a logdir to restore from; pass the logdir")
    if value is None or not isinstance(value, (str, os.PathLike)):
        return check_int("restore_step", value, minimum=0, allow_none=True)
    path = local_path(check_path("restore_step", value)).rstrip("/")
    if logdir is not None and is_url(logdir) and is_url(path):
        parent, name = path.rsplit("/", 1)
        home = logdir.rstrip("/")
    else:
        parent, name = os.path.split(os.path.abspath(path))
        home = None if logdir is None or is_url(logdir) else os.path.abspath(logdir)
        path = os.path.abspath(path)
    if parent != home or not re.fullmatch(re.escape(basename) + r"-\d+", name):
        raise ValueError(f"restore_step={os.fspath(value)!r} is not a checkpoint of the logdir {logdir!r} (named "
                         f"<logdir>/{basename}-<step>); pass one of its checkpoints or a step, or warm-start from "
                         "another run with supervisor.restore_partial(<checkpoint>, model) in init_fn")
    return path


def _check_creatable(name: str, path: str) -> None:
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ValueError(f"{name} {path!r} cannot be created: {ancestor!r} is a file, not a directory; "
                         "choose another path")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "written" if ancestor == os.path.abspath(path) else "created"
        if os.statvfs(ancestor).f_flag & os.ST_RDONLY:
            raise ValueError(f"{name} {path!r} cannot be {what}: {ancestor!r} is on a read-only filesystem "
                             "(EROFS); choose a directory on a writable filesystem")
        raise ValueError(f"{name} {path!r} cannot be {what}: no write permission on {ancestor!r}; choose a "
                         "directory you can write, or fix its permissions")
