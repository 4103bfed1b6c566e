"""SIGKILL of the writer in the middle of a multipart upload (SPEC §16 "SIGKILL mid-upload"),
against the real moto server: a 64 MiB state in 5 MiB parts, killed after its third part
upload. No checkpoint appears (no manifest: the parts are not even an object yet), the next
writer removes what the dead one left — the unfinished multipart upload included, which no
listing of objects shows — and resumes from the previous checkpoint bit-exact."""
from __future__ import annotations

import logging
import os

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager, latest_checkpoint  # noqa: E402
from supervisor.checkpoint.ownership.lease import LEASE_DIR  # noqa: E402
from tests import zygote  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402
from tests.checkpoint.s3.upload_killer import model  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def _uploads(s3_storage, url: str) -> list[dict]:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    return s3_storage.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix).get("Uploads", [])


def test_a_writer_killed_mid_upload_leaves_no_checkpoint_and_the_next_one_cleans_up_and_resumes(
        s3_server, s3_root, s3_storage, caplog):
    logdir = s3_root + "/run"
    done = zygote.python([os.path.join(HERE, "upload_killer.py"), s3_server.endpoint, logdir, "--parts", "3"],
                         timeout=150, env={**os.environ, "OMP_NUM_THREADS": "1",
                                           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == -9, done.stdout + done.stderr
    assert "committed 1" in done.stdout and "killing after part 3 of" in done.stdout, done.stdout
    leftover = f"{logdir}/model.ckpt-2"
    assert not s3_storage.exists(f"{leftover}/MANIFEST.json")
    assert latest_checkpoint(logdir, storage=s3_storage) == f"{logdir}/model.ckpt-1"
    in_flight = _uploads(s3_storage, leftover)
    assert [u["Key"].split("/")[-3::2] for u in in_flight] == [["model.ckpt-2", "state.pt"]]  # under its save's root

    s3_storage.remove_tree(f"{logdir}/{LEASE_DIR}")  # the dead writer's lease (takeover after expiry: tests/checkpoint)
    manager = CheckpointManager(logdir, storage_options=options(s3_server.endpoint))
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        manager.open()
    try:
        assert _uploads(s3_storage, leftover) == []
        assert any(leftover in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records), caplog.text
        state = TrainingState.from_arguments(model=torch.nn.Linear(4096, 4096, bias=False))
        assert manager.restore(state).global_step == 1
        expected = model().weight
        assert torch.equal(state["model"].weight, expected)
    finally:
        manager.close()
