"""What an exporter's directory holds on disk (SPEC §10.3): the complete exports, their records,
and what killed exports leave behind.

``<export_path>/<version>/`` is a complete export (see `supervisor.estimator.exporters`); hidden
``.<version>.tmp-<host>-<pid>-<random>`` directories are exports being written (or killed while
written), ``.<version>.deleting-<random>`` ones old exports being deleted (or killed while
deleted). Readers list complete exports only; `remove_crashed_exports` deletes the leftovers.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import struct
from typing import Any, Mapping

from supervisor.checkpoint import get_checkpoint_state, read_manifest
from supervisor.events import open_regular_file

__all__ = ["WEIGHTS_FILE", "PROGRAM_FILE", "SAFETENSORS_FILE", "RESULT_FILE", "list_exports", "new_version_dir",
           "remove_crashed_exports", "read_export_record", "export_step", "exported_results", "checkpoint_of_step"]

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
PROGRAM_FILE = "model.pt2"
SAFETENSORS_FILE = "model.safetensors"
RESULT_FILE = "eval_result.json"


_TEMP = re.compile(r"^\.\d+\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{16}$")
_DELETING = re.compile(r"^\.\d+\.deleting-[0-9a-f]{16}$")


def remove_crashed_exports(export_dir_base: str) -> list[str]:
    """Deletes what killed exports left in ``export_dir_base`` (see the module docstring) and
    returns the paths: old exports renamed aside for deletion (``.<version>.deleting-*``), and
    temp directories of this host's exports whose process no longer exists."""
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


def new_version_dir(base: str, timestamp: int) -> str:
    versions = [int(v) for v, _ in list_exports(base)]
    version = max([timestamp] + [v + 1 for v in versions])
    return os.path.join(base, str(version))


def list_exports(export_path: str) -> list[tuple[str, str]]:
    """``(version, path)`` of the complete exports under ``export_path``, oldest first."""
    try:
        names = os.listdir(export_path)
    except FileNotFoundError:
        return []
    found = [(int(n), n) for n in names if n.isdigit() and os.path.isdir(os.path.join(export_path, n))]
    return [(n, os.path.join(export_path, n)) for _, n in sorted(found)]


def exported_results(export_path: str, evaluations: Mapping[int, dict[str, Any]]) -> tuple[list[dict], bool]:
    """The eval results of the exports under ``export_path`` (a damaged record replaced by the
    evaluation of the export's step), and whether some export's result could not be known."""
    results, unknown = [], False
    for _, path in list_exports(export_path):
        result = read_export_record(path)
        if result is None:
            step = export_step(path)
            result = evaluations.get(step) if step is not None else None
            if result is None:
                unknown = True
                continue
            logger.warning("using the evaluation of step %d from the eval events for the export %s", step, path)
        results.append(result)
    return results, unknown


def read_export_record(export_dir: str) -> dict[str, Any] | None:
    try:
        with open_regular_file(os.path.join(export_dir, RESULT_FILE)) as f:
            record = json.loads(f.read().decode("utf-8"))
        return dict(record["metrics"], global_step=int(record["global_step"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring the export record of %s: %s", export_dir, e)
        return None


def export_step(export_dir: str) -> int | None:
    """The step of an export, from the ``global_step`` metadata of its ``model.safetensors``
    (the header is read without the package: an 8-byte length, then JSON)."""
    try:
        with open_regular_file(os.path.join(export_dir, SAFETENSORS_FILE)) as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                return None
            return int(json.loads(f.read(length))["__metadata__"]["global_step"])
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None


def checkpoint_of_step(model_dir: str, step: int) -> str | None:
    """The committed checkpoint of ``step`` the index of ``model_dir`` lists, or None."""
    try:
        state = get_checkpoint_state(model_dir)
    except ValueError:
        return None
    for path in state.all_model_checkpoint_paths if state is not None else ():
        try:
            if read_manifest(path).step == step:
                return path
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None
