"""Exports to an ``s3://`` base (SPEC §10.3, §16; issue 24 item 1) against a real moto server: the
files are uploaded, the manifest last; an export exists if and only if its manifest does
(listings, garbage collection and the exporters see complete versions only); what an interrupted
export leaves (a writer SIGKILLed before its manifest) is removed by the next export with a WARNING;
an export is read back from the URL."""
from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch

from supervisor.checkpoint import MANIFEST_FILE
from supervisor.estimator import LatestExporter
from supervisor.estimator.exporters import list_exports, open_export_file, read_export_file
from tests import zygote
from tests.estimator.estimator_toy import X, endless, make_estimator
from tests.estimator.s3.helpers import options

pytestmark = pytest.mark.timeout(120)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def test_export_from_a_local_model_dir_to_s3_reads_back_from_the_url(s3_server, s3_root, s3_storage, tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    opts = options(s3_server.endpoint)
    est = make_estimator(tmp_path / "run", example_input=X[:2])
    est.train(endless(), max_steps=5)
    base = s3_root + "/exports"
    path = est.export(base, eval_result={"loss": 0.5, "global_step": 5}, storage_options=opts)
    assert path.startswith(base + "/") and path.rsplit("/", 1)[1].isdigit()
    assert list_exports(base, opts) == [(path.rsplit("/", 1)[1], path)]
    names = s3_storage.listdir(path)
    assert MANIFEST_FILE in names and {"eval_result.json", "model.pt", "model.pt2"} <= set(names)
    manifest = json.loads(s3_storage.read_bytes(s3_storage.join(path, MANIFEST_FILE)))
    assert sorted(manifest["files"]) == sorted(n for n in names if n != MANIFEST_FILE)
    for name, record in manifest["files"].items():  # the manifest vouches for every object
        assert record["size"] == s3_storage.stat(s3_storage.join(path, name)).size
    # read back from the URL: the weights, the program, the record
    weights = torch.load(open_export_file(path, "model.pt", opts), weights_only=True)
    live = est.load_model_copy(est.latest_checkpoint())[0]
    assert all(torch.equal(weights[k], v) for k, v in live.state_dict().items())
    program = torch.export.load(open_export_file(path, "model.pt2", opts))
    assert torch.allclose(program.module()(X[:3]), live(X[:3]))
    record = json.loads(read_export_file(path, "eval_result.json", opts))
    assert record["global_step"] == 5 and record["metrics"] == {"loss": 0.5}
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no local "s3:" directory, nothing staged left


def killed_export(model_dir, base, endpoint):
    """Runs an export from ``model_dir`` to ``base`` in a child process SIGKILLed between its last
    data object and its manifest."""
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=ROOT)
    child = zygote.python([os.path.join(HERE, "kill_export.py"), model_dir, base], env=env, timeout=90)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]


def test_a_killed_export_is_ignored_then_removed_and_gc_keeps_the_newest(s3_server, s3_root, s3_storage,
                                                                         tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)  # the standard configuration, no options
    est = make_estimator(tmp_path / "run")
    est.train(endless(), max_steps=5)
    base = s3_root + "/export/latest"
    killed_export(tmp_path / "run", base, s3_server.endpoint)
    (crashed,) = [s3_storage.join(base, name) for name in s3_storage.listdir(base)]
    assert "model.pt" in s3_storage.listdir(crashed) and MANIFEST_FILE not in s3_storage.listdir(crashed)
    s3_storage.write_atomic(s3_storage.join(base, "notes", "readme.txt"), b"not an export")
    assert list_exports(base) == []  # no manifest: not an export
    exporter = LatestExporter("latest", exports_to_keep=1)
    with caplog.at_level(logging.WARNING, logger="supervisor.estimator"):
        paths = [exporter.export(est, base, est.latest_checkpoint(), {"loss": 0.3, "global_step": 5}, False)]
    assert any(crashed in r.getMessage() and "interrupted" in r.getMessage() for r in caplog.records)
    assert list_exports(base) == [(paths[0].rsplit("/", 1)[1], paths[0])]  # the crashed one removed, not listed
    manifest = json.loads(s3_storage.read_bytes(s3_storage.join(paths[0], MANIFEST_FILE)))
    assert sorted([*manifest["files"], MANIFEST_FILE]) == sorted(s3_storage.listdir(paths[0]))  # nothing stale
    paths.append(exporter.export(est, base, est.latest_checkpoint(), {"loss": 0.2, "global_step": 5}, False))
    assert [p for _, p in list_exports(base)] == paths[-1:]  # the garbage collection kept the newest
    assert s3_storage.listdir(paths[0]) == []  # the older one deleted whole, manifest first
    assert s3_storage.listdir(base) == sorted([paths[-1].rsplit("/", 1)[1], "notes"])  # not an export: kept


def test_a_failed_upload_leaves_no_export(s3_server, s3_root, s3_storage, tmp_path, monkeypatch):
    opts = options(s3_server.endpoint)
    est = make_estimator(tmp_path / "run")
    est.train(endless(), max_steps=5)
    base = s3_root + "/export/x"

    def refuse(*args, **kwargs):
        raise OSError("the manifest write failed")

    monkeypatch.setattr(type(s3_storage), "commit", refuse)
    with pytest.raises(OSError, match="manifest write failed"):
        est.export(base, storage_options=opts)
    monkeypatch.undo()
    assert list_exports(base, opts) == [] and s3_storage.list_files(base) == []  # its objects removed
    with pytest.raises(ValueError, match="storage_options were given for the local export_dir_base"):
        est.export(tmp_path / "local", storage_options=opts)
