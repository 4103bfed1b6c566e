"""``ls``, ``verify`` and ``inspect`` on ``s3://`` URLs (issue 24 item 6, SPEC §13, §16) against a
real S3-compatible server (moto over HTTP): the client configured by the environment
(``AWS_ENDPOINT_URL``) or ``--storage-options JSON``; output as for a local path; a mistyped
bucket or prefix named with the exit code of a missing local path; ``verify`` reads each
object once; ``inspect`` reads by ranges, never the tensor data."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402 - after the skip
from supervisor.cli import main  # noqa: E402
from tests.cli.s3.cli_helpers import as_json, cli, write_run  # noqa: E402
from tests.s3_fixtures import data_url, options  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def run_url(s3_server, s3_root) -> str:
    url = s3_root + "/run"
    write_run(url, s3_server.endpoint)
    return url


def test_ls_piped_json_and_human_configured_by_the_environment(s3_server, run_url):
    done = cli(s3_server.endpoint, "ls", "--json", run_url)
    assert done.returncode == 0, done.stderr
    rows = as_json(done)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["verified"] for r in rows)
    assert [r["indexed"] for r in rows] == [False, False, True]
    assert rows[2]["path"] == run_url + "/model.ckpt-3" and rows[2]["bytes"] > 1 << 20
    human = cli(s3_server.endpoint, "ls", run_url + "/")
    assert human.returncode == 0, human.stderr
    assert f"{run_url}: 3 checkpoints; the index points at model.ckpt-3" in human.stdout
    assert "model.ckpt-2" in human.stdout and "FAILED" not in human.stdout


def test_mistyped_bucket_or_prefix_is_named_with_the_missing_path_exit_code(s3_server, run_url, capsys):
    bucket = run_url.split("/")[2]
    for wrong in (f"s3://{bucket}-typo/run", f"s3://{bucket}/rnu"):
        for argv in (["ls", wrong], ["verify", wrong], ["inspect", wrong], ["prune", wrong, "--keep", "1"],
                     ["rollback", wrong, "1"]):
            code = main([*argv, "--storage-options", json.dumps(options(s3_server.endpoint))])
            err = capsys.readouterr().err
            assert code == 1, (argv, err)
            assert wrong in err and "Traceback" not in err, err
    assert main(["ls", run_url + "/model.ckpt-2", "--storage-options", json.dumps(options(s3_server.endpoint))]) == 2
    assert f"run `ls {run_url}`" in capsys.readouterr().err


def test_storage_options_argument_and_its_errors(s3_server, run_url, tmp_path, capsys):
    opts = json.dumps(options(s3_server.endpoint))
    assert main(["ls", "--json", run_url, "--storage-options", opts]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    with pytest.raises(SystemExit) as exit_info:
        main(["ls", run_url, "--storage-options", "[1]"])
    assert exit_info.value.code == 2 and "JSON object" in capsys.readouterr().err
    assert main(["ls", str(tmp_path), "--storage-options", opts]) == 2
    assert "object-store URLs only" in capsys.readouterr().err


def test_verify_reads_each_object_once_and_reports_damage(s3_server, s3_storage, run_url, monkeypatch, capsys):
    opts = ["--storage-options", json.dumps(options(s3_server.endpoint))]
    read = _count_reads(monkeypatch, under=run_url + "/model.ckpt-2/")
    assert main(["verify", "--json", run_url + "/model.ckpt-2", *opts]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["verified"] and row["step"] == 2 and not row["indexed"] and row["in_index"]
    manifest = s3_storage.stat(run_url + "/model.ckpt-2/MANIFEST.json").size
    assert 0 < read["bytes"] <= row["bytes"] + manifest  # each object once: <= 1.0x the checkpoint
    state = data_url(s3_storage, run_url + "/model.ckpt-2")
    data = bytearray(s3_storage.read_bytes(state))
    data[-100] ^= 0xFF
    s3_storage.write_atomic(state, bytes(data))
    assert main(["verify", run_url, *opts]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "model.ckpt-2" in out and out.count("ok ") == 2
    done = cli(s3_server.endpoint, "verify", run_url + "/model.ckpt-3")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


def test_inspect_reads_ranges_never_the_tensor_data(s3_server, run_url, monkeypatch, capsys):
    read = _count_reads(monkeypatch)
    assert main(["inspect", "--json", run_url, "--storage-options", json.dumps(options(s3_server.endpoint))]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["step"] == 3 and shown["indexed"] and shown["path"] == run_url + "/model.ckpt-3"
    names = {v["name"]: v for v in shown["variables"]}
    assert names["model/0.weight"]["shape"] == [1024, 256] and names["model/0.weight"]["bytes"] == 1 << 20
    assert read["bytes"] < 256 << 10, read  # the structure, not the 1 MiB of tensors
    done = cli(s3_server.endpoint, "inspect", run_url + "/model.ckpt-1")
    assert done.returncode == 0 and "model/0.weight" in done.stdout and "step 1" in done.stdout, done.stderr


def test_a_prefix_without_manifest_is_not_listed(s3_server, s3_storage, run_url):
    s3_storage.write_atomic(run_url + "/model.ckpt-9/state.pt", b"partial upload")
    rows = as_json(cli(s3_server.endpoint, "ls", "--json", run_url))
    assert [r["step"] for r in rows] == [1, 2, 3]


def _count_reads(monkeypatch, under: str = "") -> dict:
    """Bytes the object store's reads return (of objects whose URL starts with ``under``)."""
    count = {"bytes": 0}
    for name in ("read_range", "read_versioned", "read_bytes"):
        real = getattr(ObjectStoreStorage, name)

        def counted(self, *args, _real=real, **kwargs):
            out = _real(self, *args, **kwargs)
            data = out[0] if isinstance(out, tuple) else out
            count["bytes"] += len(data) if str(args[0]).startswith(under) else 0
            return out
        monkeypatch.setattr(ObjectStoreStorage, name, counted)
    return count


EVAL_FACTORY = '''
import torch

def model():
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 8))

def data():
    torch.manual_seed(0)
    return [torch.randn(2, 256)]

def eval_step(model, batch):
    return {"mean": model(batch).mean()}
'''


def test_evaluate_on_a_url_evaluates_the_run_and_exits_at_the_finished_mark(s3_server, s3_storage, run_url, tmp_path):
    from supervisor.checkpoint.layout.finished import mark_finished
    from supervisor.events import read_scalars

    (tmp_path / "evalfactory.py").write_text(EVAL_FACTORY)
    factory = str(tmp_path / "evalfactory.py")
    mark_finished(run_url, step=3, checkpoint=run_url + "/model.ckpt-3", storage=s3_storage)
    done = cli(s3_server.endpoint, "evaluate", run_url, "--model", factory + ":model", "--data", factory + ":data",
               "--eval-step", factory + ":eval_step", "--poll-secs", "0.1", "--timeout", "60", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "step 3: mean = " in done.stdout and "stopped (finished): 1 evaluated" in done.stdout
    assert sorted(read_scalars(run_url + "/eval", options(s3_server.endpoint))) == [3]
    bucket = run_url.split("/")[2]
    wrong = cli(s3_server.endpoint, "evaluate", f"s3://{bucket}-typo/run", "--model", factory + ":model",
                "--data", factory + ":data")
    assert wrong.returncode == 2 and f"s3://{bucket}-typo/run" in wrong.stderr, wrong.stderr
