"""`Location`: a directory resolved once — where it is, and the `Storage` that serves it.

A front door (`Supervisor`, `MonitoredTrainingSession`, ...) is given a directory and, for an
object-store URL, the client's ``storage_options``. It resolves the pair ONCE into a `Location`
(`supervisor.checkpoint.storage.resolve_location`, which calls `storage_for`) and passes the
location inward; the managers, the summary writer and the session creators take it instead of
the (path, storage_options) pair, so no layer builds the client again and no function in between
carries options it never reads (orbax's ``epath.Path`` that carries its filesystem; DCP's storage
objects passed in, not strings resolved at every layer).

A `Location` is an `os.PathLike` of its path, so every constructor that takes a directory path
takes a location too (``CheckpointManager(location)``): the path it names is the same, and the
storage is reused instead of resolved from the path.
"""
from __future__ import annotations

from dataclasses import dataclass

from supervisor.checkpoint.storage.base import Storage

__all__ = ["Location"]


@dataclass(frozen=True)
class Location:
    """A directory and the `Storage` that serves it, resolved once.

    Attributes:
        path: the directory in its storage's spelling: a local path (``file://`` URLs become
            theirs) or an object-store URL without a trailing ``/`` (``s3://bucket/run``).
        storage: the `Storage` of ``path`` (its client built, connecting nowhere yet).

    Example::

        location = resolve_location("s3://bucket/run", {"endpoint_url": "http://minio:9000"})
        manager = CheckpointManager(location)   # the same client; no storage_options again
    """

    path: str
    storage: Storage

    def __fspath__(self) -> str:
        return self.path

    @property
    def is_object_store(self) -> bool:
        """Whether the directory is on an object store (a URL), not on the local filesystem."""
        return self.storage.is_object_store

    def join(self, *parts: str) -> str:
        """``path/part/...`` in the storage's spelling."""
        return self.storage.join(self.path, *parts)

    def child(self, *parts: str) -> Location:
        """The location ``path/part/...``, served by the same storage (no client is built)."""
        return Location(self.join(*parts), self.storage)

    def __str__(self) -> str:
        return self.path
