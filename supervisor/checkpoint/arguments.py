"""Argument checks shared by the checkpoint manager and the session creators (messages name the
argument, the value and the fix)."""
from __future__ import annotations

import errno
import os
from typing import Any, Callable, Mapping

from supervisor._validate import check_path
from supervisor.checkpoint.storage import LocalStorage, Location, Storage, resolve_location, split_scheme
from supervisor.errors import CheckpointError

__all__ = ["CAPTURE_MODES", "check_basename", "check_capture", "check_directory", "check_writable_directory", "resolve_directory",
           "writer_storage"]


def check_directory(directory: Any) -> str:
    """An absolute local path, or an object-store URL as given (``s3://bucket/prefix``, no
    trailing ``/``); a ``file://`` URL becomes its local path."""
    path = check_path("directory", directory)
    scheme, spelled = split_scheme(path)
    if scheme == "file":
        return os.path.abspath(spelled)
    if not spelled.split("://", 1)[1].strip("/"):
        raise ValueError(f"directory {path!r} names no bucket; use {scheme}://<bucket>/<prefix>")
    return spelled.rstrip("/")


def resolve_directory(directory: Any, storage_options: Mapping[str, Any] | None = None) -> Location:
    """A manager's ``directory`` (`check_directory`, unless it is a `Location` already) resolved
    once with ``storage_options`` (`resolve_location`): the outermost constructor of a manager
    subclass calls it and hands its bases the location, never the options."""
    return resolve_location(directory if isinstance(directory, Location) else check_directory(directory),
                            storage_options)


def writer_storage(location: Location, opener: Callable[[str], Any] | None = None) -> Storage:
    """The `Storage` a checkpoint writer of ``location`` uses: the location's own; ``opener``
    (the fault-injection seam: opens each file written) applies to local directories only."""
    if opener is None:
        return location.storage
    if location.is_object_store:
        raise ValueError(f"opener={opener!r} applies to local directories only, not {location.path!r}; leave it out")
    return LocalStorage(opener)


def check_basename(basename: Any, *, argument: str = "basename") -> str:
    if not isinstance(basename, str) or not basename or os.sep in basename or basename.startswith(".") \
            or (os.altsep and os.altsep in basename) or "\0" in basename:
        raise ValueError(f"{argument} must be a plain file name such as 'model.ckpt', got {basename!r}")
    return basename


def check_writable_directory(path: Any, *, argument: str = "logdir") -> str:
    """Creates ``path`` if missing and proves it writable (creates and removes a probe file),
    so a read-only or foreign logdir fails before any thread starts, naming the path and the fix.
    An object-store URL is returned as given, unprobed: its client options are the writer's
    (``storage_options``), and its first write says what is wrong.

    Raises:
        ValueError: ``path`` exists and is not a directory.
        CheckpointError: it cannot be created or written.
    """
    scheme, spelled = split_scheme(os.fspath(path))
    if scheme != "file":
        return spelled
    storage = LocalStorage()
    path = os.path.abspath(spelled)
    if storage.exists(path) and not storage.isdir(path):
        raise ValueError(f"{argument} {path!r} exists and is not a directory; choose a directory")
    try:
        storage.makedirs(path)
    except OSError as e:
        raise CheckpointError(f"cannot create the {argument} {path} ({_errno(e)}); create it or choose a "
                              "writable location") from e
    probe = storage.join(path, f".supervisor-write-probe-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        storage.open_write(probe).close()  # created, then abandoned unsynced: removed
    except OSError as e:
        raise CheckpointError(f"the {argument} {path} is not writable ({_errno(e)}); make it writable by this "
                              f"user (uid {os.getuid() if hasattr(os, 'getuid') else '?'}), remount it "
                              "read-write, or choose another directory") from e
    return path


def _errno(error: OSError) -> str:
    return f"{errno.errorcode.get(error.errno or 0, type(error).__name__)}: {error.strerror or error}"


#: The values of ``capture=`` (SPEC §5.9): "auto" is "blocking" (it becomes "overlapped" on CUDA
#: tensors once the CUDA path has run on a GPU: ``overlap.AUTO_OVERLAPS_ON_CUDA``).
CAPTURE_MODES = ("auto", "overlapped", "blocking")


def check_capture(capture: Any) -> str:
    if not isinstance(capture, str) or capture not in CAPTURE_MODES:
        raise ValueError(f"capture must be one of {', '.join(repr(m) for m in CAPTURE_MODES)}, got {capture!r}: "
                         "'overlapped' copies parameters and optimizer state while the next step runs, "
                         "'blocking' copies everything at the step boundary, 'auto' (the default) overlaps "
                         "when they are on CUDA")
    return capture

