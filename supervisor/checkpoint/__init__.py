"""The checkpoint engine (SPEC §2, §4, §5): crash-safe background checkpoints of a training state.

- `CheckpointManager` — save (capture now, write in the background), verify-then-fall-back
  restore, retention, ownership lock;
- `CheckpointSessionCreator` / `WorkerSessionCreator` — restore-or-init for `MonitoredSession`;
- helpers: `latest_checkpoint`, `get_checkpoint_state`, `load_checkpoint`, `restore_partial`,
  `checkpoints_iterator`, `verify_checkpoint`.

Where each concern lives: format.py (layout, manifest), fileio.py (checksums while writing,
fsync), staging.py (capture), writer.py (background thread), serialize.py (the payload's zip
format), temp.py (one temp directory, filled by one or many writers, sealed and renamed once),
commit.py (write_checkpoint, removal), index.py (the ``checkpoint`` file, an untrusted input),
retention.py (pure keep/delete rules), verify.py (a checkpoint against its manifest; vanished vs
corrupt), restore.py (load, fall back), lock.py (ownership), manager.py, creator.py, helpers.py,
dcp.py (``checkpoint_format="dcp"``: sharded, every rank writes).
"""
from __future__ import annotations

from supervisor.checkpoint.creator import CheckpointSessionCreator, WorkerSessionCreator
from supervisor.checkpoint.fileio import fsync_dir
from supervisor.checkpoint.finished import read_finished
from supervisor.checkpoint.format import (
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
from supervisor.checkpoint.helpers import (
    PartialRestoreReport,
    checkpoints_iterator,
    load_checkpoint,
    restore_partial,
)
from supervisor.checkpoint.index import CheckpointState, get_checkpoint_state, latest_checkpoint, read_index
from supervisor.checkpoint.lock import OWNER_FILE, OwnershipLock
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.options import check_trusted_globals
from supervisor.checkpoint.reader import SEPARATOR, CheckpointReader, list_variables, load_variable, resolve_checkpoint
from supervisor.checkpoint.reading import CheckpointRead, read_checkpoint
from supervisor.checkpoint.restore import VERIFY_MODES, Restored
from supervisor.checkpoint.restore import check_checkpoint as verify_checkpoint

__all__ = [
    "CheckpointManager",
    "CheckpointReader",
    "CheckpointSessionCreator",
    "CheckpointState",
    "Manifest",
    "PartialRestoreReport",
    "WorkerSessionCreator",
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
    "check_trusted_globals",
    "checkpoint_name",
    "fsync_dir",
    "list_committed",
    "read_checkpoint",
    "read_finished",
    "read_index",
    "read_manifest",
    "resolve_checkpoint",
    "step_of",
    "transient_base",
]
