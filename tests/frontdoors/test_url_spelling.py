"""A URL with a wrong spelling is refused, never made a local directory (issue 34 items 7, 8).

``logdir="s3:/bucket/x"`` (one slash) used to train on the local disk in ``./s3:/bucket/x``,
exit 0. One rule for every entry point (`supervisor.checkpoint.storage.split_scheme`): a path
that starts with ``<scheme>:`` for a URL scheme (``s3``, ``gs``, ``file``, ``http``...) must be
spelled ``<scheme>://`` in lowercase; ``file://`` must be followed by an absolute path
(``file:///abs``, or ``file://localhost/abs``). The message names the fix; ``./s3:x`` is the way
to name such a local directory on purpose. Checked at construction: nothing is created.
"""
from __future__ import annotations

import os

import pytest
import torch

import hooks
from supervisor import (CheckpointManager, MonitoredTrainingSession, Supervisor, checkpoints_iterator,
                        latest_checkpoint, load_checkpoint)
from supervisor.estimator import Estimator, RunConfig, SidecarEvaluator
from tests.cli.helpers import cli, make_logdir

pytestmark = pytest.mark.timeout(120)


def _model():
    model = torch.nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


DOORS = {
    "Supervisor": lambda d: Supervisor(d, *_model()),
    "MonitoredTrainingSession": lambda d: MonitoredTrainingSession(d, *_model()),
    "MonitoredTrainingSession.summary_dir": lambda d: MonitoredTrainingSession("run", *_model(), summary_dir=d),
    "RunConfig": lambda d: RunConfig(d),
    "Estimator": lambda d: Estimator(d, model=_model()[0]),
    "CheckpointManager": lambda d: CheckpointManager(d),
    "CheckpointSaverHook": lambda d: hooks.CheckpointSaverHook(d, save_steps=1),
    "SummarySaverHook": lambda d: hooks.SummarySaverHook(save_steps=1, output_dir=d),
    "StepCounterHook": lambda d: hooks.StepCounterHook(output_dir=d),
    "SidecarEvaluator": lambda d: SidecarEvaluator(_model()[0], [], d),
    "SidecarEvaluator.log_dir": lambda d: SidecarEvaluator(_model()[0], [], "run", log_dir=d),
    "latest_checkpoint": lambda d: latest_checkpoint(d),
    "load_checkpoint": lambda d: load_checkpoint(d),
    "checkpoints_iterator": lambda d: next(iter(checkpoints_iterator(d, timeout=0.01))),
}

# (the bad spelling, what the message must say: the fix)
MISSPELT = [
    ("s3:/bucket/x", "'s3://bucket/x'"),
    ("s3:bucket/x", "'s3://bucket/x'"),
    ("s3:\\\\bucket\\x", "'s3://bucket/x'"),
    ("S3://bucket/x", "'s3://bucket/x'"),
    ("gs:/bucket/x", "'gs://bucket/x'"),
    ("file:/abs/x", "'file:///abs/x'"),
    ("file:rel/x", "'rel/x'"),
    ("file://rel{tmp}/x", "'file:///rel{tmp}/x'"),  # on today's main: trained in {tmp}/x
]


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize(("spelt", "fix"), MISSPELT, ids=[m[0] for m in MISSPELT])
def test_a_misspelt_url_is_refused_naming_the_fix(door, spelt, fix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spelt, fix = spelt.format(tmp=tmp_path), fix.format(tmp=tmp_path)
    with pytest.raises(ValueError) as info:
        DOORS[door](spelt)
    message = str(info.value)
    assert repr(spelt) in message and fix in message, message
    assert os.listdir(tmp_path) == []  # no ./s3:/bucket/x


def test_a_local_directory_named_like_a_scheme_is_reached_with_dot_slash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"'\./s3:/bucket/x'"):  # the message says how
        Supervisor("s3:/bucket/x", *_model())
    sv = Supervisor("./s3:/bucket/x", *_model())
    assert sv.logdir == "./s3:/bucket/x"
    assert latest_checkpoint("./s3:/bucket/x") is None


@pytest.mark.parametrize("door", ["Supervisor", "RunConfig", "CheckpointManager"])
def test_a_file_url_is_its_local_path(door, tmp_path):
    made = DOORS[door](f"file://{tmp_path}/run")
    where = {"Supervisor": "logdir", "RunConfig": "model_dir", "CheckpointManager": "directory"}[door]
    assert getattr(made, where) == f"{tmp_path}/run"
    assert DOORS[door](f"file://localhost{tmp_path}/run") is not None


def test_the_cli_takes_file_urls_as_supervisor_does(tmp_path):
    make_logdir(tmp_path / "run", steps=(100, 200))
    url = f"file://{tmp_path}/run"
    assert latest_checkpoint(url) == f"{tmp_path}/run/model.ckpt-200"
    for args in (("ls", url), ("verify", url), ("verify", url + "/model.ckpt-100"),
                 ("inspect", url + "/model.ckpt-200"), ("prune", url, "--keep", "1")):
        result = cli(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert "does not exist" not in result.stderr
    assert sorted(n for n in os.listdir(tmp_path / "run") if n.startswith("model.ckpt")) == ["model.ckpt-200"]


@pytest.mark.parametrize(("spelt", "fix"), MISSPELT[:2] + MISSPELT[5:6])
def test_the_cli_refuses_a_misspelt_url_naming_the_fix(spelt, fix, tmp_path):
    result = cli("ls", spelt)
    assert result.returncode == 2, result.stderr
    assert fix in result.stderr and "Traceback" not in result.stderr
