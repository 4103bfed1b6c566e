"""A tiered session that resumes from its local tier opens the logdir only after its first step
(SPEC §17, issue 33: resume from the local tier <= 1.0x a plain local restore, session part too).

The logdir is ``s3://`` on a real moto server behind a loopback proxy that notes every request;
the restore proves from the local tier's record that the local checkpoint is the newest, so
nothing before the first step needs the logdir. Opening it (importing ``s3fs``/``aiobotocore``/
``botocore``, ~0.4 s of CPU, more on a loaded machine; the lease; the index and listing) used to
start with the session and compete with the restore and the first step. The resume runs in a
fresh interpreter (import side effects); at its first step it waits until the persist worker
settled — it said its open waits, or it finished opening (`first_step_probe`: a handshake) — then
notes the client's modules and marks the end of the step for the proxy. Test of the refusal of a
second writer with the open deferred: `test_tier_resume.py`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from supervisor.checkpoint.layout.index import read_index
from tests import zygote
from tests.s3_fixtures import FaultProxy, make_bucket

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROBE = os.path.join(HERE, "first_step_probe.py")


def test_a_resume_from_the_local_tier_opens_the_logdir_only_after_its_first_step(tmp_path, s3_server, s3_storage):
    logdir, local, marker = make_bucket(s3_storage) + "/run", str(tmp_path / "node"), tmp_path / "first-step-ended"
    env = {**os.environ, "S3_ENDPOINT": s3_server.endpoint, "PYTHONPATH": ROOT, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    first = zygote.python([PROBE, logdir, local, "--steps", 4, "--out", tmp_path / "first.json"], env=env, timeout=180)
    assert first.returncode == 0, first.stderr
    requests: list[tuple[str, str, bool]] = []  # (command, path, made after the first step ended)
    with FaultProxy(s3_server.port) as proxy:
        proxy.intercept = lambda command, path: requests.append((command, path, marker.exists()))
        resumed = subprocess.run([sys.executable, PROBE, logdir, local, "--steps", "7", "--out",
                                  str(tmp_path / "second.json"), "--watch", str(marker)],
                                 env={**env, "S3_ENDPOINT": proxy.endpoint}, cwd=ROOT, capture_output=True,
                                 text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    seen = json.loads((tmp_path / "second.json").read_text())
    assert "restored step 4 from the local tier" in resumed.stderr, resumed.stderr
    assert seen["restored"] == 4 and seen["last"] == 7 and seen["settled"] is True, seen
    assert seen["at_first_step"] == [], seen  # nothing of the client yet
    assert [(c, p) for c, p, after in requests if not after] == [], "requests made before the first step ended"
    assert seen["opening_before_first_step_ended"] is False, seen
    # The logdir was opened once the first step was done: the final checkpoint was persisted.
    assert any(after for *_, after in requests)
    assert read_index(logdir, storage=s3_storage).model_checkpoint_path.endswith("model.ckpt-7"), resumed.stderr
