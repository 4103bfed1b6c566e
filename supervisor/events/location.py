"""Where an events directory lives: a local path (today's POSIX code serves it, unchanged) or an
object-store URL (``s3://bucket/prefix``, served through the storage seam, SPEC §16)."""
from __future__ import annotations

import os
from typing import Any, Mapping

from supervisor.checkpoint.storage import Location, Storage, resolve_location, split_scheme, storage_for

__all__ = ["locate"]


def locate(directory: str | os.PathLike | Location,
           storage_options: Mapping[str, Any] | None = None) -> tuple[Storage | None, str]:
    """``(None, path)`` for a local path or ``file://`` URL; ``(storage, url)`` (no trailing
    ``/``) for an object-store URL; a `Location` resolved already gives its own storage.

    Raises:
        ValueError: ``storage_options`` for a local path, or an unknown URL scheme.
        ImportError: the scheme's optional client is missing (the message names the extra).
    """
    if isinstance(directory, Location):
        location = resolve_location(directory, storage_options)  # refuses storage_options again
        return (location.storage if location.is_object_store else None), location.path
    scheme, where = split_scheme(directory)
    if scheme == "file":
        storage_for(where, storage_options)  # refuses storage_options for a local path, naming it
        return None, where
    return storage_for(where, storage_options), where.rstrip("/")
