"""No curve point is lost when a run is SIGKILLed right after a checkpoint commits (issue 30
item 7; README, TensorBoard: "keeps the point at the restored step").

A real 20-line training program (curve_trainer.py: a ``loss`` point at every step, a checkpoint
every 7) SIGKILLs itself on the checkpoint writer thread the moment a commit is published, five
lives in a row; each rerun restores that checkpoint and goes on. After every kill, TensorBoard's
own ``EventAccumulator`` must find a point at every step up to the restored one (the rerun starts
after it, so a point missing there is lost for good), and at the end exactly one point per step
(the rerun's ``SessionLog.START`` hides the killed life's points past its checkpoint). Locally
and on a real S3-compatible server (moto), whose logdir is read through the objects' download.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.storage import LocalStorage
from supervisor.events import EVENTS_PREFIX
from tests import zygote
from tests.s3_fixtures import lifetime_thread_prefixes, make_bucket, options, s3_server, s3_storage  # noqa: F401

pytestmark = pytest.mark.timeout(300)

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "curve_trainer.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILLS, SAVE_STEPS = 5, 7
MAX_STEPS = KILLS * SAVE_STEPS + 5


@pytest.fixture(params=["local", "s3"])
def logdir(request, tmp_path):
    """``(storage, logdir, storage_options)`` of each backend."""
    if request.param == "local":
        return LocalStorage(), str(tmp_path / "run"), None
    server, storage = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_storage")
    return storage, make_bucket(storage) + "/run", options(server.endpoint)


def _life(where: str, storage_options, out: str) -> tuple[int, str]:
    """One run of the trainer to its end (killed or finished): its exit status and output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    args = [where, MAX_STEPS, "kill"] + ([json.dumps(storage_options)] if storage_options else [])
    life = zygote.Forked(TRAINER, args, output=out, env=env)
    try:
        status = life.wait(120)
    finally:
        life.kill()
    with open(out) as f:
        return status, f.read()


def _loss_steps(storage, where: str, scratch: str) -> list[int]:
    """The steps of the ``loss`` curve as TensorBoard shows the logdir (an object store's events
    objects downloaded first, into a fresh directory)."""
    if not isinstance(storage, LocalStorage):
        os.makedirs(scratch)
        for name in storage.listdir(where):
            if name.startswith(EVENTS_PREFIX):
                with open(os.path.join(scratch, name), "wb") as f:
                    f.write(storage.read_bytes(storage.join(where, name)))
        where = scratch
    accumulator = EventAccumulator(where, size_guidance={"scalars": 0})
    accumulator.Reload()
    return [event.step for event in accumulator.Scalars("loss")] if "loss" in accumulator.Tags()["scalars"] else []


@pytest.mark.slow  # six training processes (forked from the zygote) per backend
def test_every_point_up_to_the_restored_step_survives_a_sigkill_right_after_each_commit(logdir, tmp_path):
    storage, where, storage_options = logdir
    started = time.monotonic()
    for life in range(KILLS + 1):
        status, output = _life(where, storage_options, str(tmp_path / f"life{life}.out"))
        if life == KILLS:
            assert status == 0 and f"finished {MAX_STEPS}" in output, output
            break
        restored = (life + 1) * SAVE_STEPS  # what the next life restores: the commit it was killed after
        assert status == -signal.SIGKILL and f"killed after {restored}" in output, (status, output)
        index = read_index(where, storage=storage)
        assert index.model_checkpoint_path == f"model.ckpt-{restored}"
        steps = _loss_steps(storage, where, str(tmp_path / f"events{life}"))
        missing = sorted(set(range(1, restored + 1)) - set(steps))
        assert not missing, f"kill {life + 1} (after the commit of step {restored}) lost the points of steps {missing}"
    assert _loss_steps(storage, where, str(tmp_path / "events")) == list(range(1, MAX_STEPS + 1))
    print(f"{KILLS} kills, {MAX_STEPS} points kept, in {time.monotonic() - started:.1f} s")
