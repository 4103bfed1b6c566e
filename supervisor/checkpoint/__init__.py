"""The checkpoint engine (SPEC §2, §4, §5): crash-safe background checkpoints of a training state.

- `CheckpointManager` — save (capture now, write in the background), verify-then-fall-back
  restore, retention, ownership lock;
- `TieredCheckpointManager` — checkpoint tiers (SPEC §17): saves to a node-local directory,
  a verified background copy of every K-th one in the logdir (tiered.py, persist.py,
  tier_copy.py, tier_restore.py, tier_options.py);
- `PendingSave` — what a capture returns: the step, the path, the committed future;
- helpers: `latest_checkpoint`, `get_checkpoint_state`, `load_checkpoint`, `restore_partial`,
  `checkpoints_iterator`, `verify_checkpoint`.

Where each concern lives (docs/architecture.md has the map and the import rules):
``storage/`` (the seam, local, ``s3/``), ``ownership/`` (lock, lease), ``layout/`` (format,
index, finished mark, retention, verify, fencing), ``formats/`` (``state.pt``, DCP, safe
unpickling), ``load/`` (the one verified loader, choose, apply, TF's reader API), ``save/``
(capture, the writer thread, temp, commit, publish), ``manager.py`` (`CheckpointManager`),
``arguments.py`` (argument checks), ``sharded/`` (``checkpoint_format="dcp"``).

The session creators moved to `supervisor.creators` (issue 23: this package never imports the
floors above it); ``supervisor.checkpoint.CheckpointSessionCreator`` and
``WorkerSessionCreator`` still resolve, through the module ``__getattr__`` below.
"""
from __future__ import annotations

from typing import Any

from supervisor.checkpoint.save.commit import deletable_problem, remove_checkpoint
from supervisor.checkpoint.storage.fileio import fsync_dir
from supervisor.checkpoint.layout.finished import read_finished
from supervisor.checkpoint.layout.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    META_KEY,
    RNG_KEY,
    STATE_FILE,
    STEP_KEY,
    Manifest,
    checkpoint_name,
    list_committed,
    read_manifest,
    step_of,
    transient_base,
)
from supervisor.checkpoint.load.checkpoint_utils import (
    PartialRestoreReport,
    checkpoints_iterator,
    load_checkpoint,
    restore_partial,
)
from supervisor.checkpoint.layout.index import (
    CheckpointState,
    get_checkpoint_state,
    latest_checkpoint,
    read_index,
    relative_index,
    write_index,
)
from supervisor.checkpoint.ownership.lock import OWNER_FILE, OwnershipLock
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.save.in_flight import PendingSave
from supervisor.checkpoint.arguments import check_basename, check_capture, check_writable_directory
from supervisor.checkpoint.load.variables import SEPARATOR, CheckpointReader, list_variables, load_variable, resolve_checkpoint
from supervisor.checkpoint.load.loader import CheckpointRead, read_checkpoint, verify_checkpoint
from supervisor.checkpoint.layout.verify import VERIFY_MODES
from supervisor.checkpoint.load.apply import Restored
from supervisor.checkpoint.load.choose import choose_checkpoint
from supervisor.checkpoint.formats.safe_globals import check_loadable, check_trusted_globals

__all__ = [
    "CheckpointManager",
    "CheckpointReader",
    "CheckpointSessionCreator",  # moved: see MOVED
    "CheckpointState",
    "Manifest",
    "PartialRestoreReport",
    "PendingSave",
    "WorkerSessionCreator",  # moved: see MOVED
    "checkpoints_iterator",
    "get_checkpoint_state",
    "latest_checkpoint",
    "list_variables",
    "load_checkpoint",
    "load_variable",
    "restore_partial",
    "verify_checkpoint",
    # for the estimator and the CLI (issue 23: they import this façade, never the modules)
    "CheckpointRead",
    "INDEX_FILE",
    "MANIFEST_FILE",
    "META_KEY",
    "OWNER_FILE",
    "OwnershipLock",
    "RNG_KEY",
    "Restored",
    "SEPARATOR",
    "STATE_FILE",
    "STEP_KEY",
    "VERIFY_MODES",
    "check_basename",
    "check_capture",
    "check_loadable",
    "check_trusted_globals",
    "check_writable_directory",
    "checkpoint_name",
    "choose_checkpoint",
    "deletable_problem",
    "fsync_dir",
    "list_committed",
    "read_checkpoint",
    "read_finished",
    "read_index",
    "read_manifest",
    "relative_index",
    "remove_checkpoint",
    "resolve_checkpoint",
    "step_of",
    "transient_base",
    "write_index",
]

#: Names that moved out of this package (issue 23), still importable from it: name -> module.
MOVED = {"CheckpointSessionCreator": "supervisor.creators.chief", "WorkerSessionCreator": "supervisor.creators.worker"}


def __getattr__(name: str) -> Any:
    """The names in `MOVED`, resolved at first use (PEP 562): the session creators stand above
    this package, which never imports them at import time. The one upward import of
    ``supervisor/checkpoint``, kept only so that older code importing them from here still works."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from supervisor import creators  # the moved names; never at import time (see the docstring)

    return getattr(creators, name)
