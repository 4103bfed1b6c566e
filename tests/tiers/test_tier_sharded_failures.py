"""Sharded checkpoint tiers whose copies to the logdir keep failing (SPEC §5.2, §17, issue 33):
each failed copy counts toward ``max_consecutive_save_failures`` as with replicated state (a
copy that succeeds resets the count; by default the first failure is fatal), and a fatal one
ends the job on every rank with the save-failure policy's error. The logdir is a real
S3-compatible server (moto) behind the loopback proxy, which refuses (``403 AccessDenied``) the
uploads of the chosen steps' copies — on 2 real gloo ranks."""
from __future__ import annotations

import re

import pytest

from supervisor.checkpoint.layout.format import list_committed
from tests.distributed.harness import describe, run_job
from tests.s3_fixtures import FaultProxy, make_bucket

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODULE = "tests.tiers.tier_sharded_worker"


def _refusing(steps: set[int]):
    """The proxy's rule: refuse every upload into the copy of one of ``steps``."""
    def refuse(command: str, path: str) -> bool:
        found = re.search(r"/model\.ckpt-(\d+)/", path)
        return command in ("PUT", "POST") and found is not None and int(found.group(1)) in steps
    return refuse


def test_failed_copies_count_toward_max_consecutive_save_failures_on_every_rank(tmp_path, s3_server, s3_storage):
    logdir, local = make_bucket(s3_storage) + "/run", str(tmp_path / "local")
    with FaultProxy(s3_server.port) as proxy:
        proxy.refuse = _refusing({1, 3, 4})  # 1 fails, 2 resets the count, 3 and 4 fail in a row
        results = run_job("dcp_tier_copy_failures", 2, logdir, local, "6", "2", module=MODULE, timeout=300,
                          extra_env={"S3_ENDPOINT": proxy.endpoint})
    assert all(r.returncode == 0 for r in results), describe(results)
    for r in results:
        assert r.result["step"] == 5, describe(results)  # the save after the fatal copy raised it
        assert "persisting the sharded checkpoint of step 4" in r.result["error"]
        assert "2 saves in a row failed; max_consecutive_save_failures=2" in r.result["error"]
        assert "(1 of max_consecutive_save_failures=2 failures in a row)" in r.output  # steps 1 and 3: WARNINGs
        assert r.result["parts"] == ["model.ckpt-4", "model.ckpt-4.all-ranks"]  # nothing newer saved
    assert [name for _, name in list_committed(logdir, "model.ckpt", s3_storage)] == ["model.ckpt-0", "model.ckpt-2"]


def test_a_failed_copy_ends_a_front_door_job_on_every_rank_by_default(tmp_path, s3_server, s3_storage):
    logdir, local = make_bucket(s3_storage) + "/run", str(tmp_path / "local")
    with FaultProxy(s3_server.port) as proxy:
        # the first copy (step 0) arrives; every later one is refused. Which step is copied next
        # is 4, or a later one when the copy of step 0 is still in flight at step 4 (a due step
        # is passed over then, not queued): the first refused copy, whichever, ends the job.
        proxy.refuse = _refusing(set(range(1, 13)))
        results = run_job("dcp_tiers", 2, logdir, local, "12", "4", "no", module=MODULE, timeout=300,
                          extra_env={"S3_ENDPOINT": proxy.endpoint})
    failed = set()
    for r in results:
        assert r.returncode not in (0, None), describe(results)
        found = re.search(r"CheckpointError: persisting the sharded checkpoint of step (\d+)", r.output)
        assert found is not None and 4 <= int(found.group(1)) <= 12, describe(results)
        failed.add(found.group(1))
        assert "AccessDenied" in r.output or "Access Denied" in r.output
    assert len(failed) == 1, describe(results)  # every rank ended on the same copy
    assert [name for _, name in list_committed(logdir, "model.ckpt", s3_storage)] == ["model.ckpt-0"]
