"""Argument checks shared by the checkpoint manager and the session creators (messages name the
argument, the value and the fix)."""
from __future__ import annotations

import os
from typing import Any, Iterable

__all__ = ["check_basename", "check_directory", "check_trusted_globals"]


def check_directory(directory: Any) -> str:
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise TypeError(f"directory must be a non-empty path (str or os.PathLike), got {directory!r}")
    return os.path.abspath(os.fspath(directory))


def check_basename(basename: Any) -> str:
    if not isinstance(basename, str) or not basename or os.sep in basename or basename.startswith(".") \
            or (os.altsep and os.altsep in basename):
        raise ValueError(f"basename must be a plain file name such as 'model.ckpt', got {basename!r}")
    return basename


def check_trusted_globals(trusted: Any) -> tuple:
    if isinstance(trusted, (str, bytes)) or not isinstance(trusted, Iterable):
        raise TypeError("trusted_globals must be a list of classes or functions (the objects, not "
                        f"their names), got {trusted!r}")
    trusted = tuple(trusted)
    for i, item in enumerate(trusted):
        ok = callable(item) or (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str))
        if not ok:
            raise TypeError(f"trusted_globals[{i}] must be a class or function (or a (object, "
                            f"'module.name') pair), got {item!r}")
    return trusted
