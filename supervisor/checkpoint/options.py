"""Argument checks shared by the checkpoint manager and the session creators (messages name the
argument, the value and the fix)."""
from __future__ import annotations

import os
from typing import Any, Iterable

from supervisor._paths import check_path

__all__ = ["check_basename", "check_directory", "check_trusted_globals"]


def check_directory(directory: Any) -> str:
    return os.path.abspath(check_path("directory", directory))


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
