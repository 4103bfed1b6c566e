"""Ranks of sharded jobs on an ``s3://`` logdir, registered into tests/distributed/worker.py's
scenarios and run by its main: ``python -m tests.distributed.s3.dcp_s3_worker SCENARIO ...`` (see
tests/distributed/harness.py, ``module=``). The client options come as JSON on the command line."""
from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import torch
import torch.distributed as dist

from tests.distributed import worker
from tests.distributed.worker import emit, full_state, scenario, sharded, train_sharded_step


@scenario
def dcp_s3_session(url: str, last_step: str, options: str, kind: str = "fsdp2") -> None:
    """A sharded model through MonitoredTrainingSession(checkpoint_format="dcp",
    checkpoint_dir=url) until ``last_step``, saving every 2 steps; any world size (a restore
    reshards). With ``SUPERVISOR_TEST_KILL_SEAL_AT=N`` the chief is SIGKILLed at step N's commit
    once every rank's shards are uploaded and the manifest is sealed, before it is written; with
    ``SUPERVISOR_TEST_KILL_UPLOAD_AT=N`` rank 1 is SIGKILLed in the middle of uploading its shard
    of step N (written, the upload not completed)."""
    import hooks
    from supervisor import MonitoredTrainingSession

    model, optimizer = sharded(0, kind)
    _kill_chief_before_the_manifest(int(os.environ.get("SUPERVISOR_TEST_KILL_SEAL_AT", "-1")))
    _kill_rank_1_mid_upload(int(os.environ.get("SUPERVISOR_TEST_KILL_UPLOAD_AT", "-1")))
    torch.manual_seed(1000 + dist.get_rank())  # each rank's own RNG stream (a restore replaces it)
    with MonitoredTrainingSession(checkpoint_dir=url, model=model, optimizer=optimizer, checkpoint_format="dcp",
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step))],
                                  save_checkpoint_steps=2, log_step_count_steps=None, save_summaries_steps=None,
                                  stop_grace_secs=20, max_wait_secs=60, storage_options=json.loads(options)) as s:
        start = s.global_step
        restored = full_state(model)  # what every rank restored (a collective: every rank, same point)
        while not s.should_stop():
            s.run(lambda: train_sharded_step(model, optimizer, s.global_step))
        end = s.global_step
    emit({"start": start, "restored": restored, "end": end, "full": full_state(model), "draw": torch.rand(1).item()})


def _kill_chief_before_the_manifest(step: int) -> None:
    if step < 0 or dist.get_rank() != 0:
        return
    from supervisor.checkpoint.save import temp

    seal = temp.TempCheckpoint.seal

    def dying_seal(self: Any, *, step: int, **kwargs: Any) -> Any:
        manifest = seal(self, step=step, **kwargs)  # every rank's shards are uploaded by now
        if step == kill_at:
            print(f"killing the chief before the manifest of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return manifest

    kill_at = step
    temp.TempCheckpoint.seal = dying_seal  # type: ignore[method-assign]


def _kill_rank_1_mid_upload(step: int) -> None:
    if step < 0 or dist.get_rank() != 1:
        return
    from supervisor.checkpoint.storage.s3 import objects as object_io

    sync = object_io.MultipartWriter.sync

    def dying_sync(self: Any) -> None:
        if re.search(rf"model\.ckpt-{step}/(g[0-9a-f-]+/)?__1_", self.path):  # under the save's data root
            print(f"killing rank 1 in the middle of uploading {self.path} ({self.nbytes} bytes written)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        sync(self)

    object_io.MultipartWriter.sync = dying_sync  # type: ignore[method-assign]


main = worker.main

if __name__ == "__main__":
    main()
