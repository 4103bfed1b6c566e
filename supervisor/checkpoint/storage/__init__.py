"""The storage seam (SPEC §16): every filesystem call of the runtime goes through one `Storage`.

A `Storage` names its files by strings in its own spelling: OS paths for `LocalStorage`,
``s3://bucket/key`` URLs for the object store (`supervisor.checkpoint.storage.s3.store`). The
operations are the ones the checkpoint engine needs, with the guarantees it relies on:

* `open_write` — a new file, written in order, its CRC-32 computed while it is written
  (``nbytes``, ``checksum``; no second read); ``sync()`` makes it durable and visible (fsync /
  completing the multipart upload), ``close()`` without ``sync()`` abandons it.
* `write_atomic` — a small object replaced whole (readers see the old or the new one).
* `create_exclusive` — a small object created only if absent (``O_EXCL``/``link`` locally,
  ``If-None-Match: *`` on S3); `ObjectExistsError` otherwise. The content is complete the moment
  the name appears.
* `replace_if` — replaced only while it still is the version read (`ObjectInfo.version`:
  the ETag on S3); `PreconditionFailedError` otherwise. On S3 the server checks atomically;
  locally it is compare-then-replace, atomic only among writers that hold the logdir's lock
  (see `LocalStorage.replace_if`).
* `read_bytes` / `read_versioned` / `read_range` / `open_read` — regular files only (a FIFO or a
  device named like a checkpoint file never blocks a reader).
* `open_snapshot` — every listed file of a directory opened before any is read (a `Snapshot`):
  what the read-once verified loader needs while retention deletes underneath it.
* `stat`, `listdir`, `list_files`, `remove`, `remove_tree`, `makedirs`.
* The directory commit, orbax's ``TemporaryPath`` idea: `stage` names where a checkpoint's files
  are written, `commit` seals it with its manifest and makes it visible in one step — rename of
  a temp directory on POSIX, the manifest written last with a conditional create on an object
  store (no rename there: a checkpoint exists if and only if its manifest exists) — and
  `discard` removes a staged one; `uncommit` makes a committed one stop existing in one step
  (renamed to ``<name>.deleting-<hex>`` locally; its manifest deleted on an object store) and
  returns where its remains are, for `remove_tree`.
* `entry_kind` (``"file"``, ``"dir"``, ``"link"``, ``"other"`` or None, links not followed),
  `checksum` (size and CRC-32 of a file written by other means, made durable first), `rename`
  (locally; an object store has none: ``OSError(ENOTSUP)``) and `sync_dir` (fsync of a
  directory's entries locally; nothing on an object store, where a write is durable once it
  returns).

`storage_for(path_or_url)` picks the implementation by URL scheme: a local path or ``file://``
→ `LocalStorage`; ``s3://`` → ``ObjectStoreStorage`` (needs the extra
``pip install "torch-supervisor[s3]"``; imported only then, so the runtime never needs s3fs).
``memory://`` → `supervisor.checkpoint.storage.memory.MemoryStorage` (fsspec's in-process
memory filesystem: tests, one process). Other schemes can be added with `register_scheme`, or by
another package through the entry-point group ``torch_supervisor.storage`` (`ENTRY_POINT_GROUP`),
which every process — the CLI, a sidecar — reads when it meets an unknown scheme.
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import urllib.parse
from typing import Any, Callable, Mapping

from supervisor.checkpoint.storage.local import LocalStorage
from supervisor.checkpoint.storage.location import Location
from supervisor.checkpoint.storage.base import (REQUIRED_METHODS, STORAGE_KINDS, ObjectExistsError, ObjectInfo,
                                                PreconditionFailedError, Snapshot, SnapshotVanishedError, Storage,
                                                StorageWriter, check_declared)

__all__ = [
    "ObjectExistsError", "ObjectInfo", "PreconditionFailedError", "REQUIRED_METHODS", "STORAGE_KINDS", "Snapshot",
    "SnapshotVanishedError", "Storage", "StorageWriter", "check_declared",
    "ENTRY_POINT_GROUP", "LocalStorage", "Location", "URL_SCHEMES", "check_location", "check_storage", "check_url_spelling",
    "is_url", "options_for", "register_scheme", "relocate", "resolve_location", "storage_for", "split_scheme",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------- registration
#: ``scheme -> (factory(url, storage_options) -> Storage, the pip extra that provides it)``
_FACTORIES: dict[str, tuple[Callable[[str, Mapping[str, Any]], Storage], str | None]] = {}
_LOCAL = LocalStorage()
#: The entry-point group other packages declare storage backends in (name: the URL scheme).
ENTRY_POINT_GROUP = "torch_supervisor.storage"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def register_scheme(scheme: str, factory: Callable[[str, Mapping[str, Any]], Storage] | type[Storage],
                    extra: str | None = None) -> None:
    """Makes ``storage_for`` answer URLs ``<scheme>://...`` with ``factory(url, options)``: a
    callable, or a `Storage` subclass (its ``from_url(url, options)`` classmethod; its contract is
    checked now, `check_declared`). ``factory`` may raise ``ImportError`` when its client is
    missing; ``extra`` names the pip extra the error then asks for. What a factory returns is
    checked when it is first called (`check_declared`: a missing member is named there, not at
    the first restore). Another process (the CLI, a sidecar) finds a scheme through the
    entry-point group `ENTRY_POINT_GROUP` instead."""
    scheme = scheme.lower()
    if isinstance(factory, type):
        check_declared(factory, scheme)
        if not callable(getattr(factory, "from_url", None)):
            raise TypeError(f"register_scheme({scheme!r}, {factory.__qualname__}): a Storage class registered as "
                            "a factory needs a from_url(url, storage_options) classmethod; add one or register "
                            "a function (url, storage_options) -> Storage")
        factory = factory.from_url
    _FACTORIES[scheme] = (factory, extra)


def _discover(scheme: str) -> None:
    """Registers ``scheme`` from the entry-point group `ENTRY_POINT_GROUP` (an installed package's
    ``[project.entry-points."torch_supervisor.storage"] <scheme> = "module:factory_or_class"``),
    read only when an unknown scheme is met."""
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name.lower() == scheme]
    if not found:
        return
    if len(found) > 1:
        logger.warning("%d entry points of %s name the scheme %r (%s); using the first", len(found),
                       ENTRY_POINT_GROUP, scheme, ", ".join(ep.value for ep in found))
    register_scheme(scheme, found[0].load())


def split_scheme(path_or_url: str | os.PathLike) -> tuple[str, str]:
    """``("file", path)`` for a local path or ``file://`` URL, else ``(scheme, url)``.

    Raises:
        ValueError: a misspelt URL (`check_url_spelling`), naming the fix.
    """
    text = os.fspath(path_or_url)
    if not isinstance(text, str):
        raise TypeError(f"a logdir must be a str path or URL, got {text!r}")
    check_url_spelling(text)
    match = _SCHEME.match(text)
    if match is None or len(match.group(1)) == 1:  # "C://..." on Windows is a drive, not a scheme
        return "file", text
    scheme = match.group(1).lower()
    if scheme == "file":
        return "file", urllib.parse.unquote(urllib.parse.urlparse(text).path)
    return scheme, text


#: Schemes whose ``<scheme>:`` prefix makes a path a URL, never a local directory: this seam's
#: own and the usual filesystem URL schemes (fsspec's protocols), so a misspelt one is refused.
URL_SCHEMES = frozenset({"file", "s3", "s3a", "s3n", "gs", "gcs", "az", "abfs", "abfss", "adl", "wasb", "wasbs",
                         "oss", "hdfs", "webhdfs", "http", "https", "ftp", "sftp", "ssh", "memory", "hf", "dbfs"})
_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):(.*)$", re.S)


def check_url_spelling(text: str) -> None:
    """Refuses a path that starts like a URL but is not spelled as one (issue 34): for a scheme of
    `URL_SCHEMES` (or a registered one), ``<scheme>:`` must be followed by ``//`` and the scheme
    written in lowercase (``s3:/b/x``, ``s3:b/x``, ``s3:\\b\\x`` and ``S3://b/x`` are refused, naming
    ``s3://b/x``); a ``file://`` URL names an absolute path (``file:///abs``; the host may only be
    ``localhost``). A local directory named so on purpose is written ``./s3:x``.

    Raises:
        ValueError: naming the path, what is wrong and the spelling to use.
    """
    match = _PREFIX.match(text)
    if match is None or (match.group(1).lower() not in URL_SCHEMES and match.group(1).lower() not in _FACTORIES):
        return
    scheme, rest = match.group(1).lower(), match.group(2)
    if match.group(1) == scheme and rest.startswith("//"):
        if scheme == "file":
            _check_file_url(text, rest)
        return
    body = rest.replace("\\", "/").lstrip("/")
    if scheme == "file":
        fix = f"'file:///{body}'" if rest.startswith(("/", "\\")) else f"the local path {body!r}"
    else:
        fix = repr(f"{scheme}://{body}")
    if rest.startswith("//"):
        raise ValueError(f"{text!r}: URL schemes are written in lowercase; write {fix}")
    raise ValueError(f"{text!r} looks like a URL ({scheme}://) but '{match.group(1)}:' is not followed by '//'; "
                     f"write {fix}. A local directory with that name is written {'./' + text!r}")


def _check_file_url(text: str, rest: str) -> None:
    host, _, path = rest[2:].partition("/")
    if host not in ("", "localhost"):
        raise ValueError(f"{text!r} names the host {host!r}: a file:// URL is followed by an absolute path "
                         f"(three slashes); write 'file:///{rest[2:]}' for the absolute path /{rest[2:]}, or "
                         f"{rest[2:]!r} for the path relative to the working directory")
    if not path:
        raise ValueError(f"{text!r} names no path; write file:///<absolute path>, or a local path")


def storage_for(path_or_url: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """The `Storage` that serves ``path_or_url``: `LocalStorage` for local paths and
    ``file://``; the registered backend for other schemes (``s3://`` → the object store).

    Raises:
        ValueError: an unknown scheme (the message names the URL and the known schemes).
        ImportError: the scheme's optional client is not installed (the message names the
            extra, e.g. ``pip install "torch-supervisor[s3]"``).
    """
    if isinstance(path_or_url, Location):  # resolved already: its storage, never a second client
        return resolve_location(path_or_url, storage_options).storage
    scheme, url = split_scheme(path_or_url)
    if scheme == "file":
        if storage_options:
            raise ValueError(f"storage_options={dict(storage_options)!r} were given for the local path "
                             f"{url!r}; they apply to object-store URLs only (s3://...)")
        return _LOCAL
    _register_builtin()
    if scheme not in _FACTORIES:
        _discover(scheme)
    if scheme not in _FACTORIES:
        known = ", ".join(sorted(["file"] + list(_FACTORIES)))
        raise ValueError(f"{os.fspath(path_or_url)!r}: no storage for the URL scheme {scheme!r} "
                         f"(known: {known}; a local path needs no scheme)")
    factory, extra = _FACTORIES[scheme]
    try:
        storage = factory(url, dict(storage_options or {}))
    except ImportError as e:
        hint = f'pip install "torch-supervisor[{extra}]"' if extra else "install its client"
        raise ImportError(f"{os.fspath(path_or_url)!r} needs the optional {scheme}:// client, which is not "
                          f"installed ({e}); install it with: {hint}") from e
    check_declared(storage, scheme)
    return storage


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an object-store URL (``s3://...``), not a local path or ``file://``:
    the question ``storage.is_object_store`` answers, asked of a path (only ``file`` is local)."""
    return split_scheme(path)[0] != "file"


def options_for(path: str | os.PathLike, storage_options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The client options of ``path``: ``storage_options`` for a URL, None for a local path
    (which takes none), so one set of options serves a URL logdir beside local directories."""
    return dict(storage_options) if storage_options and is_url(path) else None


def resolve_location(directory: str | os.PathLike | Location,
                     storage_options: Mapping[str, Any] | None = None) -> Location:
    """The `Location` of ``directory``: the directory itself when it is one already (then no
    ``storage_options`` may be given: its client is built), else resolved now with `storage_for`
    (a local path or ``file://`` URL: its path; a URL: as given, without a trailing ``/``).

    Raises:
        ValueError: ``storage_options`` with a `Location` or a local path, or an unknown scheme.
        ImportError: the scheme's optional client is missing (the message names the extra).
    """
    if isinstance(directory, Location):
        if storage_options:
            raise ValueError(f"storage_options={dict(storage_options)!r} were given with the resolved location "
                             f"{directory.path!r}, whose client is built already; drop them")
        return directory
    storage = storage_for(directory, storage_options)
    scheme, spelled = split_scheme(directory)
    return Location(spelled if scheme == "file" else spelled.rstrip("/"), storage)


def relocate(base: Location, path: str | os.PathLike | Location) -> Location | None:
    """The `Location` of ``path`` beside the resolved ``base``, building no client: ``path`` itself
    when it is a location; a local path (or ``file://`` URL): the local storage; a URL of
    ``base``'s scheme: ``base``'s storage (a storage serves every path of its scheme, with the
    options it was built with); None for a URL of another scheme (`resolve_location` that one,
    with its own options)."""
    if isinstance(path, Location):
        return path
    scheme, spelled = split_scheme(path)
    if scheme == "file":
        return Location(spelled, _LOCAL if base.is_object_store else base.storage)
    if scheme == base.storage.scheme:
        return Location(spelled.rstrip("/"), base.storage)
    return None


def check_location(name: str, path: str | None, storage_options: Any) -> Location | None:
    """The `Location` of the directory argument ``name`` (None when ``path`` is None), resolved
    once at construction and checked (`check_storage`'s rules)."""
    _check_options(name, path, storage_options)
    if path is None or not is_url(path):
        return None if path is None else resolve_location(path)
    try:
        return resolve_location(path, storage_options)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from e


def check_storage(name: str, path: str | None, storage_options: Any) -> dict[str, Any] | None:
    """The client options of ``path`` (None when there are none), checked at construction: for
    a URL its scheme is known and its client installed (`storage_for` builds the client, which
    connects nowhere yet); for a local path no ``storage_options`` may be given. A front door
    keeps the client instead: `check_location`."""
    _check_options(name, path, storage_options)
    if path is None or not is_url(path):
        return None
    check_location(name, path, storage_options)
    return dict(storage_options) if storage_options else None


def _check_options(name: str, path: str | None, storage_options: Any) -> None:
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a dict of the object-store client's options "
                        f"(e.g. {{'endpoint_url': ...}}) or None, got {storage_options!r}")
    if storage_options and (path is None or not is_url(path)):
        where = f"the local path {path!r}" if path is not None else "no directory"
        raise ValueError(f"storage_options={dict(storage_options)!r} were given with {name}={path!r}, "
                         f"{where}: they configure the client of an object-store URL (s3://bucket/prefix) "
                         "only; drop them or pass a URL")


def _register_builtin() -> None:
    if "s3" not in _FACTORIES:
        register_scheme("s3", _object_store_factory, extra="s3")
    if "memory" not in _FACTORIES:
        register_scheme("memory", _memory_factory)


def _memory_factory(url: str, options: Mapping[str, Any]) -> Storage:
    from supervisor.checkpoint.storage.memory import MemoryStorage  # imported on first use (fsspec)

    return MemoryStorage.from_url(url, options)


def _object_store_factory(url: str, options: Mapping[str, Any]) -> Storage:
    # Imported here, on first use of an s3:// URL, so the runtime never needs s3fs (the module
    # itself imports s3fs at its top, which is what raises ImportError when the extra is missing).
    from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage

    return ObjectStoreStorage.from_url(url, options)
