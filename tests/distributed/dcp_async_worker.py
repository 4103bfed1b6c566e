"""Scenarios of asynchronous sharded saves, registered into worker.py's and run by its main:
``python -m tests.distributed.dcp_async_worker SCENARIO ...`` (see harness.py, ``module=``)."""
from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from supervisor import distributed
from tests.distributed import worker
from tests.distributed.worker import emit, full_state, scenario, sharded, train_sharded


@scenario
def dcp_async_save(logdir: str, kind: str = "dtensor") -> None:
    """An async save of step 3 whose writes are held until the training thread has changed every
    parameter in place; then a save of step 4 that fails on rank 1 (an injected ENOSPC)."""
    from supervisor import TrainingState
    from supervisor.checkpoint.sharded import commit as dcp_commit
    from supervisor.checkpoint.sharded import ShardedCheckpointManager
    from supervisor.errors import CheckpointError

    model, optimizer = sharded(0, kind)
    train_sharded(model, optimizer, 3)
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    full = full_state(model)  # a collective on the training thread, before the save
    manager = ShardedCheckpointManager(logdir)
    manager.open()
    commits: list[Any] = []
    manager.on_commit = lambda step, path: commits.append([step, path])
    gate, real = threading.Event(), dcp_commit.write_own_part
    dcp_commit.write_own_part = lambda path, save: (gate.wait(60), real(path, save))[1]
    start = time.perf_counter()
    path = manager.save(3, state)
    stall = time.perf_counter() - start
    published_at_return = os.path.exists(path)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1000.0)  # the next step's in-place update: the checkpoint must not see it
    gate.set()
    manager.wait()
    rng = torch.rand(2).tolist()
    dcp_commit.write_own_part = real
    failed = _failing_save(manager, state) if dist.get_rank() == 1 else None
    if failed is None:
        try:
            manager.save(4, state, wait=True)
            failed = "no error"
        except CheckpointError as e:
            failed = str(e)
    manager.close()
    emit({"path": path, "full": full, "rng": rng, "stall": stall, "published_at_return": published_at_return,
          "commits": commits, "failed": failed})


def _failing_save(manager: Any, state: Any) -> str:
    """Rank 1's save of step 4 with ``FileSystemWriter.write_data`` failing (disk full)."""
    from torch.distributed.checkpoint import FileSystemWriter

    from supervisor.errors import CheckpointError

    def disk_full(self: Any, plan: Any, planner: Any) -> Any:
        raise OSError(28, "No space left on device (injected)")

    real = FileSystemWriter.write_data
    FileSystemWriter.write_data = disk_full  # type: ignore[method-assign]
    try:
        manager.save(4, state, wait=True)
        return "no error"
    except CheckpointError as e:
        return str(e)
    finally:
        FileSystemWriter.write_data = real  # type: ignore[method-assign]


@scenario
def dcp_async_killed(logdir: str, last_step: str, kill_step: str, when: str = "after") -> None:
    """`worker.dcp_session` (MonitoredTrainingSession, checkpoint_format="dcp", async saves) where
    rank 1 is SIGKILLed by its writer thread during the save of ``kill_step``: after its shards
    are written and fsynced, before the chief has its checksums (``when="after"``), or before it
    joins ``dcp.save``'s collectives (``"before"``: the chief's DCP collective then fails with
    gloo's "Connection closed by peer")."""
    from supervisor.checkpoint.sharded import commit as dcp_commit

    real = dcp_commit.write_own_part
    entered = f"test/chief-enters-dcp-save/{kill_step}"  # the handshake: the chief is entering dcp.save
    if dist.get_rank() == 0 and when == "before":
        def entering(path: str, save: Any) -> Any:
            if save.step == int(kill_step):
                distributed.default_store().set(entered, "1")
            return real(path, save)

        dcp_commit.write_own_part = entering
    if dist.get_rank() == 1:
        def dying(path: str, save: Any) -> Any:
            if when == "before" and save.step == int(kill_step):
                print(f"killing rank 1 before its DCP save of step {save.step}", flush=True)
                distributed.default_store().wait([entered], datetime.timedelta(seconds=60))
                os.kill(os.getpid(), signal.SIGKILL)
            outcome = real(path, save)
            if save.step == int(kill_step):
                print(f"killing rank 1 during the async save of step {save.step} "
                      f"({threading.current_thread().name}, shards written: {outcome['ok']})", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return outcome

        dcp_commit.write_own_part = dying
    worker.dcp_session(logdir, last_step, "dtensor")


if __name__ == "__main__":
    worker.main()
