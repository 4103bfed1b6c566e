"""``examples/quickstart.py --logdir s3://bucket/run`` against a real moto server (issue 24 item
9), configured as a user's shell would be: ``AWS_ENDPOINT_URL`` and credentials in the
environment, nothing else. Run twice, it resumes from the checkpoint on the server."""
from __future__ import annotations

import os

import pytest

from tests import zygote
from tests.s3_fixtures import CREDENTIALS, options

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _quickstart(url, endpoint, steps, cwd):
    env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": ROOT}
    return zygote.python([os.path.join(ROOT, "examples", "quickstart.py"), "--logdir", url, "--steps", steps,
                          "--summary-secs", "0.5"], env=env, timeout=240, cwd=cwd)


def test_quickstart_on_s3_trains_and_resumes(s3_server, s3_root, s3_storage, tmp_path):
    url = s3_root + "/quickstart"
    first = _quickstart(url, s3_server.endpoint, 150, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"starting from step 0 in {url}; training to step 150" in first.stdout
    assert "stopped at step 150" in first.stdout

    second = _quickstart(url, s3_server.endpoint, 300, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming at step 150 in {url}; training to step 300" in second.stdout
    assert "stopped at step 300" in second.stdout
    names = s3_storage.listdir(url)
    assert {"checkpoint", "model.ckpt-300"} <= set(names)
    assert any(n.startswith("events.out.tfevents.") for n in names)
    assert os.listdir(tmp_path) == []  # nothing local: no ./s3:/... directory
