"""The command line on object-store URLs (``s3://bucket/prefix``; SPEC §13, §16).

Every subcommand takes a URL where it takes a path. The client is configured the standard way
(the ``AWS_*`` environment, ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_S3``, ``~/.aws``, fsspec's
``FSSPEC_S3_*``) or by ``--storage-options JSON`` (a JSON object passed to the client as
``storage_options``, e.g. ``'{"endpoint_url": "http://127.0.0.1:9000"}'``; refused for a local
path). What differs from a local path, and why:

* A prefix exists when something is stored under it; a mistyped bucket or prefix is reported
  naming the URL, with the exit code of a missing local path.
* A checkpoint exists if and only if its ``MANIFEST.json`` does (the commit protocol): a prefix
  without one (an upload in progress or interrupted) is not listed.
* ``verify`` reads each object once (CRC-32 while reading); ``inspect`` reads the manifest and
  the pickled structure by range reads, never the tensor data.
* ``rollback``/``prune`` take the logdir's lease (``lock="lease"``) while they change it; a live
  lease refuses them naming its holder and when it expires. They rewrite the index and delete
  only committed checkpoint prefixes of the run's basename (`deletable_problem`).
"""
from __future__ import annotations

import argparse
import contextlib
from typing import Any, Callable, Iterator

from supervisor.checkpoint import CheckpointState, MANIFEST_FILE, list_committed, read_index, verify_checkpoint
from supervisor.checkpoint.layout.index import entry_problem, keep_entries
from supervisor.checkpoint.ownership.lease import Lease
from supervisor.checkpoint.ownership.lock import acquire_writer_lock
from supervisor.checkpoint.storage.records import parse_json
from supervisor.checkpoint.storage import Storage, storage_for
from supervisor.checkpoint.storage import is_url as storage_is_url
from supervisor.cli._common import (DEFAULT_BASENAME, EXIT_PROBLEM, CheckpointRow, Listing, Refused,
                                    basename_from_index, error, holding, step_in)
from supervisor.errors import CheckpointError

__all__ = ["is_url", "add_storage_options", "connect", "UrlProblem", "missing", "scan", "check_url", "lease_note",
           "lease_lock", "names_in_index", "STORAGE_OPTIONS_HELP", "is_checkpoint", "open_logdir",
           "options_for_local", "relative_url_index"]

STORAGE_OPTIONS_HELP = (
    "for s3:// URLs: the object-store client's options as a JSON object, e.g. "
    "'{\"endpoint_url\": \"http://127.0.0.1:9000\"}' (default: the standard configuration, i.e. AWS_ENDPOINT_URL, "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, FSSPEC_S3_*)")


class UrlProblem(Exception):
    """A URL that cannot be used: ``code`` is the exit code (1: missing, 2: usage)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def is_url(path: Any) -> bool:
    """Whether ``path`` (a command-line value, maybe None) is an object-store URL."""
    return isinstance(path, str) and storage_is_url(path)


def _options(text: str) -> dict[str, Any]:
    try:
        value = parse_json(text)  # a ValueError for anything but JSON, "[" * 200000 included
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object, got {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--storage-options must be a JSON object such as "
                                         f"'{{\"endpoint_url\": \"http://127.0.0.1:9000\"}}', got {text!r}")
    return value


def add_storage_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage-options", metavar="JSON", type=_options, default=None, help=STORAGE_OPTIONS_HELP)


def options_for_local(path: str, args: argparse.Namespace) -> str | None:
    """The usage error for ``--storage-options`` given with a local path (None otherwise)."""
    if getattr(args, "storage_options", None) is None:
        return None
    return (f"--storage-options apply to object-store URLs only (s3://bucket/prefix), but {path} is a local path; "
            "leave them out")


def connect(url: str, args: argparse.Namespace) -> Storage:
    """The storage of ``url`` with ``--storage-options`` (`UrlProblem` exit 2: an unknown scheme,
    a missing client, options for a local path)."""
    options = getattr(args, "storage_options", None)
    try:
        return storage_for(url, options)
    except (ValueError, TypeError, ImportError) as e:  # TypeError: an option of the wrong type
        raise UrlProblem(str(e), 2) from None


def missing(storage: Storage, url: str) -> str | None:
    """Why ``url`` names nothing (a missing bucket, nothing stored under the prefix), or None."""
    try:
        names = storage.listdir(url)
    except FileNotFoundError as e:
        return f"{url} does not exist: {e.strerror or e}"
    except OSError as e:
        return f"{url} cannot be listed: {e}"
    return None if names else f"{url} does not exist: nothing is stored under it"


def is_checkpoint(storage: Storage, url: str) -> bool:
    """Whether ``url`` is a committed checkpoint (its manifest exists)."""
    try:
        return storage.exists(storage.join(url, MANIFEST_FILE))
    except OSError:
        return False


def open_logdir(url: str, args: argparse.Namespace, command: str) -> tuple[Storage, str]:
    """The storage and the URL (no trailing ``/``) of a log directory on the command line.

    Raises:
        UrlProblem: exit 2 for a bad scheme/options or a checkpoint URL (naming what to pass),
            exit 1 for a missing bucket or prefix (as a missing local path).
    """
    url = url.rstrip("/")
    storage = connect(url, args)
    if is_checkpoint(storage, url):
        parent = storage.dirname(url)
        raise UrlProblem(f"{url} is a checkpoint, not a log directory; run `{command} {parent}`", 2)
    gone = missing(storage, url)
    if gone:
        raise UrlProblem(gone, 1)
    return storage, url


def names_in_index(url: str, index: CheckpointState | None) -> tuple[str | None, list[str]]:
    """``(the name model_checkpoint_path names, the names all_model_checkpoint_paths lists)``,
    each a checkpoint directly under ``url`` (`entry_problem`; other entries are left out)."""
    if index is None:
        return None, []
    named, _ = entry_problem(url, index.model_checkpoint_path)
    listed = [n for p in index.all_model_checkpoint_paths if (n := entry_problem(url, p)[0]) is not None]
    return named, listed


def relative_url_index(url: str, index: CheckpointState) -> CheckpointState:
    """`supervisor.checkpoint.relative_index` for a URL: the listed entries that are checkpoints
    directly under ``url``, as names (with their times); others are left out."""
    kept = [(n, i) for i, p in enumerate(index.all_model_checkpoint_paths)
            if (n := entry_problem(url, p)[0]) is not None]
    return keep_entries(index, kept)


def scan(storage: Storage, url: str, *, basename: str | None = None, verify: str = "full") -> Listing:
    """`supervisor.cli._common.scan_logdir` for a URL: committed checkpoints and those the index
    names, each verified (read once)."""
    index, problem = None, None
    try:
        index = read_index(url, storage)
    except (ValueError, OSError) as e:
        problem = str(e)
    basename = basename or basename_from_index(index) or DEFAULT_BASENAME
    named, listed = names_in_index(url, index)
    stamps = dict(zip(listed, index.all_model_checkpoint_timestamps)) if index is not None else {}
    names = dict.fromkeys([n for _, n in list_committed(url, basename, storage)] + listed + [named] * bool(named))
    rows = [check_url(storage, url, n, basename=basename, verify=verify, indexed=n == named, in_index=n in listed,
                      index_time=stamps.get(n)) for n in names]
    rows.sort(key=lambda r: (r.step is None, r.step if r.step is not None else 0, r.name))
    if named is not None and not any(r.name == named and r.reason != "listed in the index but does not exist"
                                     for r in rows):
        problem = f"the index names {index.model_checkpoint_path}, which does not exist"
    return Listing(url, basename, index, problem, rows)


def check_url(storage: Storage, logdir: str, name: str, *, basename: str | None = None, verify: str = "full",
              indexed: bool = False, in_index: bool = False, index_time: float | None = None) -> CheckpointRow:
    """`supervisor.cli._common.check_one` for the checkpoint ``logdir/name`` of an object store."""
    path = storage.join(logdir, name)
    step = step_in(name, basename)
    if not storage.exists(storage.join(path, MANIFEST_FILE)):
        where = "listed in the index but " if in_index or indexed else ""
        return CheckpointRow(step, path, name, False, f"{where}does not exist", indexed, in_index, index_time, 0)
    try:
        manifest = verify_checkpoint(path, verify, storage=storage)
    except CheckpointError as e:
        reason = str(e)
        reason = reason[len(path) + 2:] if reason.startswith(path + ": ") else reason
        return CheckpointRow(step, path, name, False, reason, indexed, in_index, index_time, 0)
    size = sum(record.size for record in manifest.files.values())
    return CheckpointRow(manifest.step if step is None else step, path, name, True, None, indexed, in_index,
                         manifest.wall_time, size)


def lease_note(storage: Storage, url: str) -> str | None:
    """Who holds the logdir's lease live (a writer is active), or None."""
    try:
        holder = Lease(storage, url).live_holder()
    except (OSError, ValueError):
        return None
    return None if holder is None else f"a writer is active: {holder.describe()}"


@contextlib.contextmanager
def lease_lock(storage: Storage, url: str) -> Iterator[None]:
    """Holds ``url``'s lease for a mutation, as a writer would (`Refused` while a writer holds it)."""
    with holding(lambda: acquire_writer_lock(storage, url, kind="lease")):
        yield


def mutate_url(args: argparse.Namespace, verb: str, change: Callable[[Storage, str], int], *,
               locked: bool = True) -> int:
    """``rollback``/``prune`` on an ``s3://`` logdir: ``change(storage, url)`` under the logdir's
    lease (``locked``; a live writer's lease refuses it), errors printed with their exit code."""
    try:
        storage, url = open_logdir(args.logdir, args, verb)
        if not locked:
            return change(storage, url)
        with lease_lock(storage, url):
            return change(storage, url)
    except UrlProblem as e:
        error(str(e))
        return e.code
    except Refused as e:
        error(str(e))
        return EXIT_PROBLEM
