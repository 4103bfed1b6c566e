"""Where an `Estimator` reads and writes: a local path or an object-store URL (SPEC §16).

Every directory of an estimator (``model_dir``, its ``eval*/`` and ``export/<name>/``
directories, a checkpoint given by path, an export base) may be an ``s3://bucket/prefix`` URL.
The `RunConfig`'s ``storage_options`` configure the object-store client of ``model_dir``; they
are passed for URLs only (a local path refuses them, `supervisor.checkpoint.storage_for`), so a
local checkpoint or export base beside an ``s3://`` model_dir still works.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from supervisor.checkpoint.storage import split_scheme

__all__ = ["is_url", "join", "options_for"]


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object-store URL (``s3://...``), not a local path or ``file://``."""
    return split_scheme(path)[0] != "file"


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base/part/...``: with ``/`` inside a URL, `os.path.join` for a local path."""
    if is_url(base):
        return "/".join([os.fspath(base).rstrip("/"), *(p.strip("/") for p in parts if p)])
    return os.path.join(os.fspath(base), *parts)


def options_for(path: str | os.PathLike, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``storage_options`` when ``path`` is a URL, else None (a local path takes none)."""
    return dict(storage_options) if storage_options and is_url(path) else None
