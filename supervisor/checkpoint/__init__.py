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
from supervisor.checkpoint.format import Manifest
from supervisor.checkpoint.helpers import (
    PartialRestoreReport,
    checkpoints_iterator,
    load_checkpoint,
    restore_partial,
)
from supervisor.checkpoint.index import CheckpointState, get_checkpoint_state, latest_checkpoint
from supervisor.checkpoint.manager import CheckpointManager
from supervisor.checkpoint.reader import CheckpointReader, list_variables, load_variable
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
]
