"""SIGKILL at random points of the local save and of the persist copy (SPEC §17), the logdir on
a local directory and on a real S3 server: after every kill the logdir lists only checkpoints
that verify (never a partial copy), the resume restores the newest checkpoint that verifies in
either tier, a wiped local tier (a replaced node) falls back to the logdir, and the run that
finishes matches an uninterrupted one bit for bit."""
from __future__ import annotations

import os
import random
import re
import shutil
import signal

import pytest
import torch

from supervisor.checkpoint.load.choose import candidates
from supervisor.checkpoint.layout.format import list_committed
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.load.loader import verify_checkpoint
from supervisor.checkpoint.storage import LocalStorage
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError
from tests import zygote
from tests.killing import trainer_env
from tests.s3_fixtures import make_bucket
from tests.tiers import tier_trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tier_trainer.py")
STEPS = 240  # a life killed at its first copy trains while the logdir opens in the background (~10 steps,
#: ~30 on a loaded 2-core machine: the object store client is imported there): a wide margin
RUN_SECS = 180


def _run(logdir, local, out, env, kill_at=None, steps=STEPS) -> tuple[int, str]:
    env = dict(env, KILL_AT=kill_at or "")
    proc = zygote.python([TRAINER, logdir, local, "--steps", steps, "--out", out], env=env, timeout=RUN_SECS)
    return proc.returncode, proc.stderr


def _verified_steps(directory: str, storage) -> list[int]:
    """The step a restore of this tier alone takes (its index's choice, else the next older one
    that verifies: SPEC §5.4), as a one-element list; [] when none."""
    for path in candidates(directory, "model.ckpt", storage):
        try:
            return [verify_checkpoint(path, storage=storage).step]
        except (CheckpointCorruptError, CheckpointNotFoundError):
            continue
    return []


def _check_logdir(logdir: str, storage) -> None:
    """Every checkpoint the logdir's index lists, and every committed one there, verifies."""
    index = read_index(logdir, storage=storage)
    for name in ([] if index is None else index.all_model_checkpoint_paths):
        verify_checkpoint(storage.join(logdir, name), storage=storage)
    for _, name in list_committed(logdir, "model.ckpt", storage):
        verify_checkpoint(storage.join(logdir, name), storage=storage)


def _restored_step(stderr: str) -> int | None:
    match = re.search(r"restored step=(\d+)", stderr)
    return int(match.group(1)) if match else None


def _kill_point(rng: random.Random, left: int) -> str:
    """A kill point the life reaches: its n-th local save (n <= the ``left`` saves it makes), or
    its first copy — the logdir opens in the background while training runs (a resume does not
    wait for it), so a life may make only its final copy, which it always makes."""
    point = rng.choice(tier_trainer.POINTS)
    return f"{point}:{1 if point.startswith('copy') else rng.randint(1, min(3, left))}"


def _kill_loop(tmp_path, logdir: str, storage, env, *, kills: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    local, out = str(tmp_path / "local"), str(tmp_path / "out.pt")
    log, expected = [], None
    for i in range(kills):
        if i == kills // 2:
            shutil.rmtree(local, ignore_errors=True)  # the node is replaced: its local tier is gone
            expected = max(_verified_steps(logdir, storage), default=None)
        left = STEPS - (expected or 0)  # the local saves this life makes (it restores `expected`)
        assert left > 0, f"the run finished before kill {i + 1} of {kills}: raise STEPS\n{log}"
        kill_at = _kill_point(rng, left)
        rc, stderr = _run(logdir, local, out, env, kill_at)
        restored = _restored_step(stderr)
        log.append(f"{kill_at}: rc={rc} restored={restored} expected={expected}")
        if restored is not None or expected is not None:
            assert restored == expected, f"{log}\n{stderr[-3000:]}"
        assert rc == -signal.SIGKILL, f"the armed kill point was not reached\n{log}\n{stderr[-3000:]}"
        _check_logdir(logdir, storage)
        expected = max(_verified_steps(local, LocalStorage()) + _verified_steps(logdir, storage), default=None)
    rc, stderr = _run(logdir, local, out, env)
    assert rc == 0 and _restored_step(stderr) == expected, f"{log}\n{stderr[-3000:]}"
    return log


def _assert_same(out: str, reference: str) -> None:
    got, want = torch.load(out), torch.load(reference)
    assert got["step"] == want["step"] == STEPS
    for key, value in want["model"].items():
        assert torch.equal(got["model"][key], value), key
    for key, value in want["opt"]["state"].items():
        for name, tensor in value.items():
            assert torch.equal(got["opt"]["state"][key][name], tensor), (key, name)


def _reference(tmp_path) -> str:
    """The uninterrupted run, in this process: the trainer's steps without any session."""
    ref, threads = str(tmp_path / "ref.pt"), torch.get_num_threads()
    torch.set_num_threads(1)  # as the trainers (OMP_NUM_THREADS=1): the same kernels, the same bits
    try:
        model, opt = tier_trainer.build()
        for step in range(STEPS):
            tier_trainer.train_step(model, opt, step)
    finally:
        torch.set_num_threads(threads)
    torch.save(tier_trainer.final_state(model, opt, STEPS), ref)
    return ref


@pytest.mark.parametrize("point", tier_trainer.POINTS)
def test_every_kill_point_of_the_trainer_is_reached(tmp_path, point):
    """A seam that the library no longer passes through would let a life armed there finish the
    job (rc=0) and make every later life a no-op: each point, armed at its first pass, kills."""
    rc, stderr = _run(str(tmp_path / "logdir"), str(tmp_path / "local"), str(tmp_path / "out.pt"), trainer_env(),
                      f"{point}:1", steps=3)
    assert rc == -signal.SIGKILL and f"killing at {point}" in stderr, f"rc={rc}\n{stderr[-3000:]}"


def test_kills_with_a_local_logdir_resume_from_the_newest_verified_tier_bit_exact(tmp_path):
    env = trainer_env()
    reference = _reference(tmp_path)
    log = _kill_loop(tmp_path, str(tmp_path / "logdir"), LocalStorage(), env, kills=12, seed=33)
    _assert_same(str(tmp_path / "out.pt"), reference)
    assert sum("rc=-9" in line for line in log) == 12, log


def test_kills_with_an_s3_logdir_resume_from_the_newest_verified_tier_bit_exact(tmp_path, s3_server, s3_storage):
    env = trainer_env(S3_ENDPOINT=s3_server.endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    reference = _reference(tmp_path)
    logdir = make_bucket(s3_storage) + "/run"
    log = _kill_loop(tmp_path, logdir, s3_storage, env, kills=10, seed=34)
    _assert_same(str(tmp_path / "out.pt"), reference)
    assert sum("rc=-9" in line for line in log) == 10, log
