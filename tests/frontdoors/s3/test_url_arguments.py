"""URL logdirs at the front doors' construction (SPEC §16, issue 24 item 1): validated without a
server, never turned into a local directory, and bad ones refused early, naming the argument,
the value and the fix."""
from __future__ import annotations

import os

import pytest
import torch

from supervisor import MonitoredTrainingSession, SingularMonitoredSession, Supervisor
from supervisor.estimator import RunConfig

from tests import zygote

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _model():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


DOORS = {
    "Supervisor": lambda d, **kw: Supervisor(d, *_model(), **kw),
    "MonitoredTrainingSession": lambda d, **kw: MonitoredTrainingSession(d, *_model(), **kw),
    "SingularMonitoredSession": lambda d, **kw: SingularMonitoredSession(d, *_model(), **kw),
    "RunConfig": lambda d, **kw: RunConfig(d, **kw),
}


@pytest.mark.parametrize("door", ["Supervisor", "RunConfig"])
def test_a_url_logdir_creates_nothing_local(door, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = DOORS[door]("s3://bucket/run/", storage_options={"endpoint_url": "http://127.0.0.1:9"})
    assert (made.logdir if door == "Supervisor" else made.model_dir) == "s3://bucket/run"
    assert os.listdir(tmp_path) == []  # no ./s3:/bucket/run


@pytest.mark.parametrize("door", sorted(DOORS))
def test_an_unknown_scheme_is_refused_naming_it(door, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'nosuchfs'.*known: file, memory, s3"):
        DOORS[door]("nosuchfs://bucket/run")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("door", sorted(DOORS))
def test_storage_options_with_a_local_path_are_refused(door, tmp_path):
    with pytest.raises(ValueError, match=r"storage_options=.*local path .*object-store URL"):
        DOORS[door](str(tmp_path / "run"), storage_options={"endpoint_url": "http://127.0.0.1:9"})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("door", ["Supervisor", "RunConfig"])
def test_a_url_without_bucket_is_refused(door):
    with pytest.raises(ValueError, match=r"'s3://'.*names no bucket.*s3://<bucket>/<prefix>"):
        DOORS[door]("s3://")


def test_storage_options_must_be_a_dict():
    with pytest.raises(TypeError, match=r"storage_options must be a dict"):
        RunConfig("s3://bucket/run", storage_options="endpoint=http://x")


def test_a_summary_dir_url_takes_the_options_with_a_local_checkpoint_dir(tmp_path):
    # Options configure whichever directory is a URL; checked at construction, no server needed.
    with pytest.raises(ValueError, match=r"'nosuchfs'"):
        MonitoredTrainingSession(str(tmp_path), *_model(), summary_dir="nosuchfs://b/x")


def test_the_missing_extra_is_named():
    """Without s3fs (hidden from the import system, in a process that never imported it:
    the zygote's children import s3fs themselves, tests/zygote.py) an s3:// logdir asks
    for the extra, at construction."""
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "import torch; from supervisor import Supervisor\n"
            "m = torch.nn.Linear(2, 1)\n"
            "try:\n    Supervisor('s3://bucket/run', m)\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    out = zygote.python(["-c", code], timeout=60,
                         env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT)
    assert 'ImportError:' in out.stdout, out.stdout + out.stderr
    assert 'pip install "torch-supervisor[s3]"' in out.stdout
    assert "'s3://bucket/run'" in out.stdout
