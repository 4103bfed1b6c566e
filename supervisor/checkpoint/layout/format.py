"""The on-disk layout of checkpoints (SPEC §2, §5.1).

::

    logdir/
      checkpoint                      # index, TF text format (index.py)
      model.ckpt-1200/                # one committed checkpoint
        MANIFEST.json                 # written last: sizes + checksums of every file
        state.pt                      # torch.save of the payload below
      model.ckpt-1300.tmp-<hex>/      # being written (or left by a crash; removed at open)
      model.ckpt-100.deleting-<hex>/  # being deleted by retention (readers skip it)
      .supervisor.lock                # ownership lock (lock.py)

``state.pt`` holds one mapping, loadable by hand with ``torch.load(path, weights_only=True)``::

    {"__meta__": {"format": ..., "format_version": 1, "torch_version": ..., "entries": [...],
                  "classes": {entry: "module.Class"}},   # "classes": absent before issue 22.17
     "global_step": 1200,
     "rng": {0: {...}},               # per rank (supervisor.state.rng); absent with save_rng=False
     "model": {...}, "optimizer": {...}, ...}   # one state dict per training-state entry

Note: ``state.pt``'s zip records carry no per-record CRC (torch's own CRC pass is skipped, see
`supervisor.checkpoint.save.commit`): ``torch.load`` does not need it, and the manifest's checksum
covers every byte of the file. ``unzip -t`` reports CRC errors on such a file; use
``python -m supervisor verify`` instead.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from supervisor.checkpoint.storage.local import LocalStorage, deleting_name
from supervisor.checkpoint.storage.records import fields, parse_object
from supervisor.checkpoint.storage.base import MANIFEST_FILE, Storage

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "STATE_FILE",
    "MANIFEST_FILE",
    "INDEX_FILE",
    "FileRecord",
    "Manifest",
    "checkpoint_name",
    "list_committed",
    "make_payload",
    "read_manifest",
    "step_of",
    "temp_name",
    "deleting_name",
    "is_transient",
]

FORMAT_NAME = "torch-supervisor-checkpoint"
FORMAT_VERSION = 1
#: The manifest version of a checkpoint whose files live under a per-save ``root`` (object stores).
ROOTED_VERSION = 2
STATE_FILE = "state.pt"
INDEX_FILE = "checkpoint"
META_KEY = "__meta__"
STEP_KEY = "global_step"
RNG_KEY = "rng"

MANIFEST_MAX_BYTES = 64 << 20  # a manifest lists file names and checksums: never this large
_LOCAL = LocalStorage()

# Any suffix (SPEC §5.1: ``*.tmp-*``), after a checkpoint-shaped name ``<basename>-<step>``:
# other writers' temp names (a hand copy, another version) are leftovers too.
_TRANSIENT = re.compile(r"^(?P<name>[^/]+-\d+)\.(?P<kind>tmp|deleting)-.+$")
#: A data root (fencing.py): ``g<lease generation:016d>-<hex>``, one path segment.
_ROOT = re.compile(r"^g\d{16}-[0-9a-f]{8,32}$")


def checkpoint_name(basename: str, step: int) -> str:
    return f"{basename}-{int(step)}"


def step_of(name: str, basename: str) -> int | None:
    """The step in a committed checkpoint's name ``<basename>-<step>``, else None."""
    match = re.fullmatch(re.escape(basename) + r"-(\d+)", name)
    return int(match.group(1)) if match else None


def temp_name(name: str) -> str:
    return f"{name}.tmp-{os.urandom(16).hex()}"


def is_transient(name: str) -> bool:
    """Whether ``name`` is a checkpoint being written or deleted (never a committed one)."""
    return _TRANSIENT.match(name) is not None


def transient_base(name: str) -> str | None:
    """The checkpoint name a transient ``<name>.tmp-*`` / ``<name>.deleting-*`` belongs to."""
    match = _TRANSIENT.match(name)
    return match.group("name") if match else None


def list_committed(directory: str, basename: str, storage: Storage | None = None) -> list[tuple[int, str]]:
    """``(step, name)`` of every directory named like a committed checkpoint, by step.

    Whether it verifies is a separate question (`supervisor.checkpoint.load.choose`). Locally a crash
    can only leave temp directories behind, so a missing manifest here means damage, not an
    interrupted write. On an object store (``storage`` given, not local) a checkpoint exists if
    and only if its manifest does: a prefix without one (an upload in progress or interrupted)
    is not listed.
    """
    storage = storage or _LOCAL
    try:
        names = storage.listdir(directory)
    except FileNotFoundError:
        return []
    remote = storage.is_object_store
    found = []
    for name in names:
        step = step_of(name, basename)
        if step is None:
            continue
        path = storage.join(directory, name)
        if storage.exists(storage.join(path, MANIFEST_FILE)) if remote else storage.isdir(path):
            found.append((step, name))
    return sorted(found)


@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint: its size in bytes and its checksum (``crc32:%08x``)."""

    size: int
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """``MANIFEST.json``: what a committed checkpoint contains; written last.

    ``root`` (object stores, format version 2): the files live under ``<checkpoint>/<root>/``,
    a name of this save alone (``g<lease generation>-<random>``, see fencing.py), so a writer
    that lost the lease can never overwrite them; ``generation``: the writer's lease generation.
    Without a root (version 1, every local checkpoint) the files sit beside the manifest."""

    step: int
    wall_time: float
    torch_version: str
    world_size: int
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    root: str | None = None
    generation: int | None = None

    def key(self, name: str) -> str:
        """Where the file ``name`` lives, relative to the checkpoint."""
        return f"{self.root}/{name}" if self.root else name

    def to_json(self) -> str:
        data = {
            "format": FORMAT_NAME,
            "format_version": ROOTED_VERSION if self.root else self.format_version,
            "step": self.step,
            "wall_time": self.wall_time,
            "torch_version": self.torch_version,
            "world_size": self.world_size,
            "files": {name: {"bytes": r.size, "checksum": r.checksum} for name, r in self.files.items()},
        }
        if self.root:
            data.update(root=self.root, generation=self.generation)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parses a manifest (untrusted: `supervisor.checkpoint.storage.records`); `ValueError` says what
        is wrong with it."""
        data = parse_object(text)
        if data.get("format") != FORMAT_NAME:
            raise ValueError(f"not a {FORMAT_NAME} manifest")
        version = data.get("format_version")
        if version not in (FORMAT_VERSION, ROOTED_VERSION) or isinstance(version, bool):
            raise ValueError(f"format version {version!r:.40} is not supported (this torch-supervisor "
                             f"reads versions {FORMAT_VERSION} and {ROOTED_VERSION}); upgrade torch-supervisor")

        def build() -> Manifest:
            files = {str(name): FileRecord(_int(r["bytes"]), str(r["checksum"])) for name, r in data["files"].items()}
            root, generation = _root(data) if version == ROOTED_VERSION else (None, None)
            return cls(step=_int(data["step"]), wall_time=float(data["wall_time"]),
                       torch_version=str(data["torch_version"]), world_size=_int(data["world_size"]),
                       files=files, format_version=version, root=root, generation=generation)
        return fields(build, "manifest")


def _root(data: Mapping[str, Any]) -> tuple[str, int]:
    root = data["root"]
    if not isinstance(root, str) or not _ROOT.match(root):
        raise ValueError(f"root {root!r} is not a data root name (g<16 digits>-<hex>)")
    return root, _int(data["generation"])


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def read_manifest(checkpoint_path: str, storage: Storage | None = None) -> Manifest:
    """Reads ``<checkpoint_path>/MANIFEST.json`` (through ``storage`` if given); `FileNotFoundError`,
    another `OSError` (e.g. `NotARegularFileError` for a FIFO: never waited on) or `ValueError`."""
    storage = storage or _LOCAL
    data = storage.read_bytes(storage.join(checkpoint_path, MANIFEST_FILE), max_bytes=MANIFEST_MAX_BYTES)
    return Manifest.from_json(data)


def make_payload(step: int, entries: Mapping[str, Any], rng: Mapping[int, Any] | None,
                 torch_version: str, classes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The mapping ``state.pt`` holds (see the module docstring). ``classes``: each entry's
    class name (``TrainingState.entry_classes``), checked at restore; older checkpoints lack it."""
    payload: dict[str, Any] = {
        META_KEY: {"format": FORMAT_NAME, "format_version": FORMAT_VERSION,
                   "torch_version": str(torch_version), "entries": [str(n) for n in entries]},
        STEP_KEY: int(step),
    }
    if classes:
        payload[META_KEY]["classes"] = {str(n): str(c) for n, c in classes.items()}
    if rng is not None:
        payload[RNG_KEY] = dict(rng)
    payload.update(entries)
    return payload
