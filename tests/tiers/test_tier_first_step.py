"""A tiered session that resumes from its local tier runs its first step without the object
store's client (SPEC §17, issue 33: resume from the local tier <= 1.0x a plain local restore).

The logdir is ``s3://`` on a real moto server; the restore proves from the local tier's record
that the local checkpoint is the newest, so nothing on the first step's path needs the logdir.
Importing ``s3fs``/``aiobotocore``/``botocore`` costs ~0.4 s (more on a loaded machine) and was
done at the front door's construction. The resume runs in a fresh interpreter (import side
effects), its persist worker held before it touches the logdir until the first step is done
(`first_step_probe.hold_the_persist_worker`): what of the client is imported by then, the first
step needed; had the first step waited for the logdir, the hold would have run out."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.checkpoint.layout.index import read_index
from tests import zygote
from tests.s3_fixtures import make_bucket

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROBE = os.path.join(HERE, "first_step_probe.py")


def test_a_resume_from_the_local_tier_runs_its_first_step_without_the_object_store_client(
        tmp_path, s3_server, s3_storage):
    logdir, local = make_bucket(s3_storage) + "/run", str(tmp_path / "node")
    env = {**os.environ, "S3_ENDPOINT": s3_server.endpoint, "PYTHONPATH": ROOT, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    first = zygote.python([PROBE, logdir, local, "--steps", 4, "--out", tmp_path / "first.json"], env=env, timeout=180)
    assert first.returncode == 0, first.stderr
    resumed = subprocess.run([sys.executable, PROBE, logdir, local, "--steps", "7", "--out", str(tmp_path / "second.json"),
                              "--probe"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    seen = json.loads((tmp_path / "second.json").read_text())
    assert "restored step 4 from the local tier" in resumed.stderr, resumed.stderr
    assert seen["restored"] == 4 and seen["last"] == 7, seen
    assert seen["at_first_step"] == [], seen  # nothing of the client yet
    assert seen["hold_ran_out"] is False, seen  # nothing waited for the logdir before the first step
    # The client came once the first step was done: the final checkpoint was persisted.
    assert read_index(logdir, storage=s3_storage).model_checkpoint_path.endswith("model.ckpt-7"), resumed.stderr
