"""``restore_step=`` with sharded checkpoint tiers (``checkpoint_format="dcp"``, ``local_dir``;
SPEC §5.4, §17, issue 33), on 2 real gloo ranks: the chosen step comes from the local tiers when
every rank holds a part of it that verifies, else from the logdir (resharding as plain ``dcp``),
else every rank fails with an error naming the step and the steps each tier holds. Newer local
parts lose their mark (kept, never restored; replaced as the run saves their steps again).
Bit-exact: training on from the chosen step reproduces the first run's later state."""
from __future__ import annotations

import os
import shutil

import pytest

import supervisor
from tests.distributed.harness import describe, run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODULE = "tests.tiers.tier_sharded_worker"


def _job(logdir: str, local: str, last: int, restore: int | None = None, crash: str = "no", ok: bool = True) -> list:
    env = {} if restore is None else {"RESTORE_STEP": str(restore)}
    results = run_job("dcp_tiers", 2, logdir, local, str(last), "4", crash, module=MODULE, timeout=240, extra_env=env)
    assert all((r.returncode == 0) == ok for r in results), describe(results)
    return results


def test_a_chosen_step_comes_from_the_local_tiers_else_the_logdir_else_a_clear_error(tmp_path):
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    first = _job(logdir, local, 6, crash="yes")  # the logdir: 0 and 4; each local tier: 5 and 6
    parts = f"{local}/node1/rank-1"
    assert sorted(os.listdir(parts)) == ["model.ckpt-5", "model.ckpt-5.all-ranks", "model.ckpt-6",
                                         "model.ckpt-6.all-ranks"]

    refused = _job(logdir, local, 7, restore=3, ok=False)  # in neither tier: every rank fails, the chief says why
    assert "CheckpointNotFoundError: no checkpoint of step 3 to restore" in refused[0].output, describe(refused)
    assert "the logdir holds steps 0, 4; the local tiers hold steps 5, 6" in refused[0].output
    assert sorted(os.listdir(parts))[-1] == "model.ckpt-6.all-ranks"  # nothing was removed

    older = _job(logdir, local, 6, restore=5)  # every rank holds step 5: from the local tiers
    assert [r.result["start"] for r in older] == [5, 5]
    assert f"restored the chosen step 5 from the local tier {local}/node0 on each of the 2 rank(s)" in \
        older[0].output, describe(older)
    assert f"the local parts of the newer step(s) 6 in {local}/node0/rank-0 are no longer restored" in older[0].output
    assert {r.result["end_digest"] for r in older} == {first[0].result["end_digest"]}  # step 5 restored bit-exact
    assert supervisor.latest_checkpoint(logdir).endswith("model.ckpt-6")  # persisted at close

    shutil.rmtree(f"{parts}/model.ckpt-6")  # rank 1 lacks step 6: the logdir's copy
    os.remove(f"{parts}/model.ckpt-6.all-ranks")
    lacking = _job(logdir, local, 7, restore=6)
    assert [r.result["start"] for r in lacking] == [6, 6]
    assert {r.result["digest"] for r in lacking} == {older[0].result["end_digest"]}
    assert [r.result["first_draw"] for r in lacking] == [r.result["next_draw"] for r in older]  # each rank's RNG
    assert f"restored the chosen step 6 from the persistent tier {logdir}" in lacking[0].output, describe(lacking)
    assert "rank 1's local tier holds no restorable part of it" in lacking[0].output
