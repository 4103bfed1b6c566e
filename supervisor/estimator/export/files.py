"""What an exporter's directory holds (SPEC §10.3): the complete exports, their records, and
what killed exports leave behind; on a local/shared filesystem or an object store.

Locally ``<export_path>/<version>/`` is a complete export (see `supervisor.estimator.exporters`);
hidden ``.<version>.tmp-<host>-<pid>-<random>`` directories are exports being written (or killed
while written), ``.<version>.deleting-<random>`` ones old exports being deleted (or killed while
deleted). On an object store (``export_path`` an ``s3://`` URL) a version is complete when its
``MANIFEST.json`` exists (`supervisor.estimator.export.objects`). Readers list complete exports
only; `remove_crashed_exports` deletes the leftovers. Every function takes a directory as a
resolved `supervisor.checkpoint.storage.Location` (the estimator's: its client built once) or as
a path or URL; the public ones (re-exported by `supervisor.estimator.exporters`) also take the
object-store client's ``storage_options`` for a URL (None: the ``AWS_*`` environment, ``~/.aws``)
and resolve it once.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import struct
from typing import IO, Any, Mapping

from supervisor.checkpoint import get_checkpoint_state, read_index, read_manifest
from supervisor.checkpoint.storage.records import fields, parse_object
from supervisor.checkpoint.storage import Location, is_url, resolve_location
from supervisor.estimator.export.objects import list_object_exports, remove_object_leftovers
from supervisor.events import open_regular_file

__all__ = ["WEIGHTS_FILE", "PROGRAM_FILE", "SAFETENSORS_FILE", "RESULT_FILE", "list_exports", "new_version_dir",
           "next_version", "remove_crashed_exports", "read_export_record", "export_step", "exported_results",
           "checkpoint_of_step", "open_export_file", "read_export_file"]

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
PROGRAM_FILE = "model.pt2"
SAFETENSORS_FILE = "model.safetensors"
RESULT_FILE = "eval_result.json"
_RECORD_MAX_BYTES = 16 << 20

Options = Mapping[str, Any] | None
#: A directory: resolved (a `Location`), or a path or URL resolved on use (without client options).
Where = str | os.PathLike | Location

_TEMP = re.compile(r"^\.\d+\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{16}$")
_DELETING = re.compile(r"^\.\d+\.deleting-[0-9a-f]{16}$")


def remove_crashed_exports(export_dir_base: Where, storage_options: Options = None) -> list[str]:
    """Deletes what killed exports left in ``export_dir_base`` (see the module docstring) and
    returns the paths: old exports renamed aside for deletion (``.<version>.deleting-*``), and
    temp directories of this host's exports whose process no longer exists; on an object store
    the version prefixes without a manifest (a WARNING each)."""
    location = resolve_location(export_dir_base, storage_options)
    if location.is_object_store:
        return remove_object_leftovers(location.storage, location.path)[0]
    export_dir_base = location.path
    try:
        names = os.listdir(export_dir_base)
    except (FileNotFoundError, NotADirectoryError):
        return []
    host, removed = socket.gethostname(), []
    for name in names:
        temp = _TEMP.match(name)
        if temp is not None and (temp["host"] != host or _process_exists(int(temp["pid"]))):
            continue
        if temp is None and _DELETING.match(name) is None:
            continue
        path = os.path.join(export_dir_base, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            logger.info("removed %s, left by an export process that was killed", path)
            removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by someone else
        return True
    return True


def next_version(timestamp: int, exports: list[tuple[str, str]]) -> int:
    """The version of a new export: ``timestamp``, bumped past the newest of ``exports``."""
    return max([timestamp] + [int(v) + 1 for v, _ in exports])


def new_version_dir(base: Location, timestamp: int) -> str:
    return os.path.join(base.path, str(next_version(timestamp, list_exports(base))))


def list_exports(export_path: Where, storage_options: Options = None) -> list[tuple[str, str]]:
    """``(version, path)`` of the complete exports under ``export_path`` (a local path or a
    URL), oldest first."""
    location = resolve_location(export_path, storage_options)
    if location.is_object_store:
        return list_object_exports(location.storage, location.path)
    export_path = location.path
    try:
        names = os.listdir(export_path)
    except FileNotFoundError:
        return []
    found = [(int(n), n) for n in names if n.isdigit() and os.path.isdir(os.path.join(export_path, n))]
    return [(n, os.path.join(export_path, n)) for _, n in sorted(found)]


def exported_results(export_path: Location, evaluations: Mapping[int, dict[str, Any]]) -> tuple[list[dict], bool]:
    """The eval results of the exports under ``export_path`` (a damaged record replaced by the
    evaluation of the export's step), and whether some export's result could not be known."""
    results, unknown = [], False
    for _, path in list_exports(export_path):
        export = Location(path, export_path.storage)
        result = read_export_record(export)
        if result is None:
            step = export_step(export)
            result = evaluations.get(step) if step is not None else None
            if result is None:
                unknown = True
                continue
            logger.warning("using the evaluation of step %d from the eval events for the export %s", step, path)
        results.append(result)
    return results, unknown


def open_export_file(export_dir: Where, name: str, storage_options: Options = None) -> IO[bytes]:
    """A binary reader of the file ``name`` of an export (a local directory or a URL): regular
    files only locally, a seekable ranged reader on an object store. What loads an export from a
    URL, e.g. ``torch.load(open_export_file(url, "model.pt", opts), weights_only=True)`` or
    ``torch.export.load(open_export_file(url, "model.pt2", opts))``."""
    location = resolve_location(export_dir, storage_options)
    if location.is_object_store:
        return location.storage.open_read(location.join(name))
    return open_regular_file(os.path.join(location.path, name))


def read_export_file(export_dir: Where, name: str, storage_options: Options = None, *,
                     max_bytes: int | None = None) -> bytes:
    """The bytes of the file ``name`` of an export (see `open_export_file`); ``OSError`` also
    when it has more than ``max_bytes``."""
    location = resolve_location(export_dir, storage_options)
    if location.is_object_store:
        return location.storage.read_bytes(location.join(name), max_bytes=max_bytes)
    with open_export_file(location, name) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise OSError(f"{os.path.join(location.path, name)} has more than {max_bytes} bytes")
    return data


def read_export_record(export_dir: Where) -> dict[str, Any] | None:
    """The eval result an export holds (``eval_result.json``), or None with a WARNING."""
    try:  # untrusted: supervisor.checkpoint.storage.records
        record = parse_object(read_export_file(export_dir, RESULT_FILE, max_bytes=_RECORD_MAX_BYTES))
        return fields(lambda: dict(_metrics(record["metrics"]), global_step=_step(record["global_step"])),
                      "export record")
    except (OSError, ValueError) as e:
        logger.warning("ignoring the export record of %s: %s", os.fspath(export_dir), e)
        return None


def export_step(export_dir: Where) -> int | None:
    """The step of an export, from the ``global_step`` metadata of its ``model.safetensors``
    (the header is read without the package: an 8-byte length, then JSON); None when it has
    none or the header is damaged."""
    try:
        with open_export_file(export_dir, SAFETENSORS_FILE) as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                return None
            header = parse_object(f.read(length))  # untrusted: supervisor.checkpoint.storage.records
        return fields(lambda: _step(int(header["__metadata__"]["global_step"])), "safetensors header")
    except (OSError, ValueError, struct.error):
        return None


def _step(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"a global step is a non-negative integer, got {value!r:.40}")
    return value


def _metrics(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"the metrics are a JSON object, got a {type(value).__name__}")
    return value


def checkpoint_of_step(model_dir: Location, step: int) -> str | None:
    """The committed checkpoint of ``step`` the index of ``model_dir`` lists, or None."""
    store = model_dir.storage if model_dir.is_object_store else None
    try:
        state = get_checkpoint_state(model_dir.path) if store is None else read_index(model_dir.path, store)
    except (OSError, ValueError):
        return None
    for path in state.all_model_checkpoint_paths if state is not None else ():
        if store is not None and not is_url(path):  # the index lists names relative to model_dir
            path = store.join(model_dir.path, path)
        try:
            if read_manifest(path, store).step == step:
                return path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
