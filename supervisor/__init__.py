"""torch-supervisor: the training-session runtime for PyTorch.

Initialise or recover the training state from a log directory, checkpoint it in the
background without ever corrupting one, write TensorBoard summaries, run session-run hooks,
and share one stop condition across threads and ranks.
"""
from __future__ import annotations

__torch_supervisor_package__ = True  # see supervisor/_shadowing.py

from supervisor.checkpoint import (
    CheckpointManager,
    CheckpointReader,
    CheckpointState,
    PartialRestoreReport,
    checkpoints_iterator,
    get_checkpoint_state,
    latest_checkpoint,
    list_variables,
    load_checkpoint,
    load_variable,
    restore_partial,
    verify_checkpoint,
)
from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
from supervisor.clock import Clock, SystemClock
from supervisor.engine.coordinator import Coordinator, LooperThread
from supervisor.creators import CheckpointSessionCreator, Restored, SessionCreator, WorkerSessionCreator
from supervisor.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVanishedError,
    LogdirInUseError,
    StopRequestedError,
    NanLossDuringTrainingError,
    RecoverableError,
    SupervisorError,
)
from supervisor.state.loop_state import LoopState
from supervisor.hook import Hook, IdleUntil, RunArgs, RunContext, RunValues, StepCall, StepContext
from supervisor.engine.session import MonitoredSession
from supervisor.state import TrainingState
from supervisor.frontdoors.supervisor import Supervisor
from supervisor.frontdoors.training_session import MonitoredTrainingSession, SingularMonitoredSession
from supervisor import creators as _creators, distributed as _distributed

# The first address of the waits for the chief's committed step (issue 32): they read the
# checkpoint index, so they live in `supervisor.creators`, above `supervisor.checkpoint`, which
# imports `supervisor.distributed`; this façade, above both, hands them on (no import back up).
_distributed.committed_step = _creators.committed_step
_distributed.wait_for_global_step = _creators.wait_for_global_step

__version__ = "0.1.0"

__all__ = [
    "CheckpointManager",
    "CheckpointReader",
    "CheckpointSessionCreator",
    "CheckpointState",
    "PartialRestoreReport",
    "TieredCheckpointManager",
    "WorkerSessionCreator",
    "checkpoints_iterator",
    "get_checkpoint_state",
    "latest_checkpoint",
    "list_variables",
    "load_checkpoint",
    "load_variable",
    "restore_partial",
    "verify_checkpoint",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointVanishedError",
    "Clock",
    "Coordinator",
    "Hook",
    "IdleUntil",
    "LogdirInUseError",
    "LoopState",
    "StopRequestedError",
    "LooperThread",
    "MonitoredSession",
    "MonitoredTrainingSession",
    "NanLossDuringTrainingError",
    "RecoverableError",
    "Restored",
    "RunArgs",
    "RunContext",
    "RunValues",
    "SessionCreator",
    "SingularMonitoredSession",
    "StepCall",
    "StepContext",
    "Supervisor",
    "SupervisorError",
    "SystemClock",
    "TrainingState",
]
