"""``rollback`` and ``prune`` on ``s3://`` URLs (issue 24 item 6, SPEC §13, §16) against a real
S3-compatible server: they change the logdir only under its lease (a live writer's lease refuses
them, naming the holder), rewrite the index, and delete only committed checkpoint prefixes."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import supervisor  # noqa: E402 - after the skip
from supervisor.checkpoint import read_index  # noqa: E402
from supervisor.checkpoint.layout.format import list_committed  # noqa: E402
from supervisor.cli import main  # noqa: E402
from tests.cli.s3.cli_helpers import cli, model, write_run  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def run_url(s3_server, s3_root) -> str:
    url = s3_root + "/run"
    write_run(url, s3_server.endpoint, steps=(1, 2, 3, 4))
    return url


def _steps(storage, url: str) -> list[int]:
    return [step for step, _ in list_committed(url, "model.ckpt", storage)]


def test_rollback_points_the_index_back_and_discards_newer(s3_server, s3_storage, run_url, capsys):
    opts = ["--storage-options", json.dumps(options(s3_server.endpoint))]
    done = cli(s3_server.endpoint, "rollback", run_url, "2")
    assert done.returncode == 0, done.stderr
    assert "now points at model.ckpt-2" in done.stdout and "newer checkpoints kept: model.ckpt-3, model.ckpt-4" \
        in done.stdout
    assert read_index(run_url, s3_storage).model_checkpoint_path == "model.ckpt-2"
    assert supervisor.latest_checkpoint(run_url, storage_options=options(s3_server.endpoint)) == \
        run_url + "/model.ckpt-2"
    assert main(["rollback", "--discard-newer", run_url, "3", *opts]) == 0
    assert "deleted model.ckpt-4" in capsys.readouterr().out
    assert _steps(s3_storage, run_url) == [1, 2, 3]
    assert "model.ckpt-4" not in read_index(run_url, s3_storage).all_model_checkpoint_paths
    assert main(["rollback", run_url, "9", *opts]) == 1
    assert "no checkpoint of step 9" in capsys.readouterr().err


def test_prune_keeps_the_newest_and_deletes_only_committed_prefixes(s3_server, s3_storage, run_url, capsys):
    stray = run_url + "/notes/readme.txt"
    s3_storage.write_atomic(stray, b"mine")
    assert main(["prune", run_url, "--keep", "2", "--dry-run", "--storage-options",
                 json.dumps(options(s3_server.endpoint))]) == 0
    assert "would delete 2: model.ckpt-1, model.ckpt-2" in capsys.readouterr().out
    assert _steps(s3_storage, run_url) == [1, 2, 3, 4]
    done = cli(s3_server.endpoint, "prune", run_url, "--keep", "2")
    assert done.returncode == 0, done.stderr
    assert _steps(s3_storage, run_url) == [3, 4]
    assert not s3_storage.list_files(run_url + "/model.ckpt-1")  # every object of the prefix, not just the manifest
    assert read_index(run_url, s3_storage).all_model_checkpoint_paths == ("model.ckpt-3", "model.ckpt-4")
    assert s3_storage.read_bytes(stray) == b"mine"


def test_a_live_writer_lease_refuses_rollback_and_prune_naming_the_holder(s3_server, s3_storage, s3_root, capsys):
    url = s3_root + "/live"
    opts = options(s3_server.endpoint)
    argv_opts = ["--storage-options", json.dumps(opts)]
    with supervisor.CheckpointManager(url, storage_options=opts, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2):
            manager.save(step, supervisor.TrainingState.from_arguments(model=model(step)))
        for argv in (["rollback", url, "1"], ["prune", url, "--keep", "1"]):
            assert main([*argv, *argv_opts]) == 1
            err = capsys.readouterr().err
            assert "refusing" in err and "pid" in err and "host" in err, err
        assert main(["ls", url, *argv_opts]) == 0
        assert "a writer is active: pid" in capsys.readouterr().out
        assert main(["prune", url, "--keep", "1", "--dry-run", *argv_opts]) == 0  # dry run: no lock taken
        capsys.readouterr()
    assert _steps(s3_storage, url) == [1, 2]
    assert read_index(url, s3_storage).model_checkpoint_path == "model.ckpt-2"
    assert main(["rollback", url, "1", *argv_opts]) == 0  # the writer released its lease at close
    assert read_index(url, s3_storage).model_checkpoint_path == "model.ckpt-1"
