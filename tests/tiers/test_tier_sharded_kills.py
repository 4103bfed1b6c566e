"""SIGKILLs of one rank of a sharded tiered job (SPEC §17, issue 33) — during its local save
(shards written, not committed; committed, not marked) and during the background copy (a file
half sent; every copy arrived, before the chief's seal): after every kill the logdir lists only
checkpoints that verify (never a partial copy), the resume restores the newest step every rank
holds in its local tier or, when that is older, the logdir's, and the run that finishes matches
an uninterrupted one bit for bit (model, optimizer)."""
from __future__ import annotations

import os
import re

import pytest

from supervisor.checkpoint.layout.format import list_committed
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.load.choose import candidates
from supervisor.checkpoint.load.loader import verify_checkpoint
from supervisor.checkpoint.tiers.sharded_parts import committed_steps
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError
from tests.distributed.harness import describe, run_job
from tests.tiers.conftest import STRAIGHT_LAST

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

MODULE = "tests.tiers.tier_sharded_worker"
LAST = STRAIGHT_LAST
#: (point, n-th time in that run, rank): 8 kills, each point on each rank or twice.
KILLS = [("part-seal", 2, 1), ("copy-write", 1, 0), ("part-mark", 2, 0), ("copy-seal", 1, 0),
         ("part-seal", 1, 0), ("copy-write", 1, 1), ("part-mark", 1, 1), ("copy-write", 2, 0)]
#: A survivor that waits for the killed rank outside any collective (e.g. rank 1 killed at its
#: part-seal while rank 0 has gone on to the next step's agreement: ~4 lives in 10) notices only
#: when the heartbeat stops: stop_grace_secs + a ping of stop_grace_secs / 4, 37.5 s at the
#: worker's 30 s; 12.5 s here. The lag a live rank may have is bounded at 20 s by the transport
#: timeout already, and 10 s of missing heartbeats (one a second) is no live process's.
FAST_DETECTION = {"SUPERVISOR_TEST_PG_TIMEOUT": "20", "TIER_STOP_GRACE": "10"}


def _local_steps(local: str, rank: int) -> set[int]:
    return _verified(f"{local}/node{rank}/rank-{rank}")


def _verified(root: str) -> set[int]:
    """The steps of the part directory ``root`` (a rank's own, or a peer replica) that verify."""
    good = set()
    for step in committed_steps(root, "model.ckpt"):
        try:
            verify_checkpoint(f"{root}/model.ckpt-{step}")
            good.add(step)
        except (CheckpointCorruptError, CheckpointNotFoundError):
            pass
    return good


def _logdir_step(logdir: str) -> int:
    for path in candidates(logdir, "model.ckpt"):
        try:
            return verify_checkpoint(path).step
        except (CheckpointCorruptError, CheckpointNotFoundError):
            continue
    return -1


def _expected(logdir: str, local: str) -> int | None:
    """The step the resume must take: the newest step both ranks hold locally, unless the logdir's is newer."""
    common = max(_local_steps(local, 0) & _local_steps(local, 1), default=-1)
    step = max(common, _logdir_step(logdir))
    return step if step >= 0 else None


def _check_logdir(logdir: str) -> None:
    """Every checkpoint the index lists, and every committed one, verifies; nothing else is listed."""
    index = read_index(logdir)
    for name in ([] if index is None else index.all_model_checkpoint_paths):
        verify_checkpoint(os.path.join(logdir, name))
    for _, name in list_committed(logdir, "model.ckpt"):
        verify_checkpoint(os.path.join(logdir, name))


def _restored(output: str) -> int | None:
    match = re.search(r"restored step=(\d+)", output)
    return int(match.group(1)) if match else None


def test_kills_during_local_saves_and_copies_resume_from_the_newest_common_step_bit_exact(tmp_path, straight_end_digest):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    log = []
    for point, n, rank in KILLS:
        expected = _expected(logdir, local)
        results = run_job("dcp_tiers", 2, logdir, local, str(LAST), "2", "no", module=MODULE, timeout=240,
                          after_rank0_secs=60, extra_env={"TIER_KILL": f"{point}:{n}:{rank}", **FAST_DETECTION})
        log.append(f"{point}:{n}:{rank}: rc={[r.returncode for r in results]} restored={_restored(results[0].output)} "
                   f"expected={expected}")
        assert f"killing rank {rank} at {point}" in results[rank].output, f"{log}\n{describe(results)}"
        assert results[rank].returncode == -9, f"{log}\n{describe(results)}"
        assert _restored(results[0].output) == expected, f"{log}\n{describe(results)}"
        _check_logdir(logdir)
    expected = _expected(logdir, local)
    final = run_job("dcp_tiers", 2, logdir, local, str(LAST), "2", "no", module=MODULE, timeout=240)
    assert all(r.returncode == 0 for r in final), f"{log}\n{describe(final)}"
    assert _restored(final[0].output) == expected and final[0].result["start"] == expected, log
    assert final[0].result["end_digest"] == straight_end_digest, log  # bit-exact with an uninterrupted run
    _check_logdir(logdir)
    assert len(log) == len(KILLS) == 8
