"""The checkpoint engine (SPEC §2, §4, §5): crash-safe background checkpoints of a training state.

- `CheckpointManager` — save (capture now, write in the background), verify-then-fall-back
  restore, retention, ownership lock;
- `CheckpointSessionCreator` / `WorkerSessionCreator` — restore-or-init for `MonitoredSession`;
- helpers: `latest_checkpoint`, `get_checkpoint_state`, `load_checkpoint`, `restore_partial`,
  `checkpoints_iterator`, `verify_checkpoint`.

Where each concern lives: format.py (layout, manifest), fileio.py (checksums while writing,
fsync), staging.py (capture), writer.py (background thread), commit.py (temp dir → rename),
index.py (the ``checkpoint`` file, an untrusted input), retention.py (pure keep/delete rules),
verify.py (a checkpoint against its manifest; vanished vs corrupt), restore.py (load, fall back), lock.py (ownership), manager.py, creator.py, helpers.py.
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
from supervisor.checkpoint.restore import check_checkpoint as verify_checkpoint

__all__ = [
    "CheckpointManager",
    "CheckpointSessionCreator",
    "CheckpointState",
    "Manifest",
    "PartialRestoreReport",
    "WorkerSessionCreator",
    "checkpoints_iterator",
    "get_checkpoint_state",
    "latest_checkpoint",
    "load_checkpoint",
    "restore_partial",
    "verify_checkpoint",
]
