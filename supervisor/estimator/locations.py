"""Where an `Estimator` reads and writes: a local path or an object-store URL (SPEC §16).

Every directory of an estimator (``model_dir``, its ``eval*/`` and ``export/<name>/``
directories, a checkpoint given by path, an export base) may be an ``s3://bucket/prefix`` URL.
The `RunConfig`'s ``storage_options`` configure the object-store client of ``model_dir``; they
are passed for URLs only (a local path refuses them, `supervisor.checkpoint.storage_for`), so a
local checkpoint or export base beside an ``s3://`` model_dir still works.
"""
from __future__ import annotations

import os

from supervisor.checkpoint.storage import is_url, options_for  # re-exported for the estimator

__all__ = ["is_url", "join", "options_for"]


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base/part/...``: with ``/`` inside a URL, `os.path.join` for a local path."""
    if is_url(base):
        return "/".join([os.fspath(base).rstrip("/"), *(p.strip("/") for p in parts if p)])
    return os.path.join(os.fspath(base), *parts)
