"""The command line end to end: real processes (tests/cli/helpers.cli), real logdirs, exit codes,
--json, human output."""
from __future__ import annotations

import configparser
import importlib
import os
import re
import shutil

import pytest
import torch

import supervisor
from supervisor.checkpoint.layout.index import read_index
from supervisor.cli import main
from tests.cli.helpers import ROOT, cli, cli_json, flip_byte, make_logdir

FIELDS = {"step", "path", "verified", "reason", "indexed"}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("good")
    make_logdir(logdir)
    return logdir


def test_ls_good_logdir(good):
    result, rows = cli_json("ls", good)
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in rows] == [100, 200, 300]
    assert all(FIELDS <= set(r) and r["verified"] and r["reason"] is None for r in rows)
    assert [r["indexed"] for r in rows] == [False, False, True]
    assert rows[2]["path"] == os.path.join(str(good), "model.ckpt-300")

    human = cli("ls", good)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert "3 checkpoints" in lines[0] and "points at model.ckpt-300" in lines[0]
    header = lines[1]
    assert re.match(r"^\s+STEP\s+NAME\s+SAVED\s+SIZE\s+STATUS$", header)
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 1 and "model.ckpt-300" in marked[0]
    body = lines[2:5]
    assert all(re.search(r"\d+(\.\d)? KiB", line) and ("ago" in line or "just now" in line) for line in body)
    assert len({line.index("model.ckpt") for line in body}) == 1  # aligned columns


def test_ls_and_verify_report_a_corrupted_checkpoint_with_the_reason(tmp_path):
    make_logdir(tmp_path)
    flip_byte(tmp_path / "model.ckpt-300" / "state.pt")
    with open(tmp_path / "model.ckpt-100" / "state.pt", "r+b") as f:
        f.truncate(100)

    result, rows = cli_json("ls", tmp_path)
    assert result.returncode == 1
    by_step = {r["step"]: r for r in rows}
    assert not by_step[300]["verified"] and "checksum" in by_step[300]["reason"]
    assert not by_step[100]["verified"] and "truncated" in by_step[100]["reason"]
    assert by_step[200]["verified"] and by_step[200]["reason"] is None

    human = cli("ls", tmp_path)
    assert human.returncode == 1
    line = next(x for x in human.stdout.splitlines()[1:] if "model.ckpt-300" in x)
    assert line.startswith("*") and "FAILED: state.pt checksum" in line and "damaged" in line
    assert "2 failing verification" in human.stdout

    bad = cli("verify", tmp_path / "model.ckpt-300")
    assert bad.returncode == 1 and "FAILED" in bad.stdout and "checksum" in bad.stdout
    ok = cli("verify", tmp_path / "model.ckpt-200")
    assert ok.returncode == 0 and ok.stdout.splitlines()[1].startswith("ok")
    assert cli("verify", tmp_path / "model.ckpt-100", "--quick").returncode == 1  # a size check catches truncation
    whole, rows = cli_json("verify", tmp_path)
    assert whole.returncode == 1 and [r["verified"] for r in rows] == [False, True, False]


def test_missing_checkpoints(tmp_path):
    make_logdir(tmp_path)
    shutil.rmtree(tmp_path / "model.ckpt-300")  # the index still names it
    result, rows = cli_json("ls", tmp_path)
    assert result.returncode == 1
    missing = next(r for r in rows if r["step"] == 300)
    assert missing["indexed"] and not missing["verified"] and "does not exist" in missing["reason"]
    human = cli("ls", tmp_path)
    assert human.returncode == 1 and "listed in the index but does not exist" in human.stdout

    gone, rows = cli_json("verify", tmp_path / "model.ckpt-300")
    assert gone.returncode == 1 and rows[0]["verified"] is False and "does not exist" in rows[0]["reason"]
    nothing = cli("ls", tmp_path / "nowhere")
    assert nothing.returncode == 1 and "not a directory" in nothing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("verify", empty).returncode == 1
    inspect_missing, obj = cli_json("inspect", tmp_path / "nowhere")
    assert inspect_missing.returncode == 1 and obj["verified"] is False and "no checkpoint" in obj["reason"]


def test_inspect_lists_names_shapes_dtypes_and_bytes(good):
    result, obj = cli_json("inspect", good)  # a logdir: the checkpoint the index names
    assert result.returncode == 0, result.stderr
    assert obj["step"] == 300 and obj["indexed"] and obj["verified"]
    variables = {v["name"]: v for v in obj["variables"]}
    weight = variables["model/0.weight"]
    assert weight["shape"] == [32, 64] and weight["dtype"] == "float32" and weight["bytes"] == 32 * 64 * 4
    assert variables["global_step"]["shape"] == [] and variables["global_step"]["dtype"] == "int64"
    assert obj["bytes"] == sum(v["bytes"] for v in obj["variables"])
    saved = supervisor.load_checkpoint(good / "model.ckpt-300")["model"]
    assert {n.split("/", 1)[1] for n in variables if n.startswith("model/")} == set(saved)

    human = cli("inspect", good / "model.ckpt-200", "--filter", "model/*")
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert "step 200" in lines[0] and "4 variables" in lines[0]
    assert re.match(r"^NAME\s+SHAPE\s+DTYPE\s+SIZE$", lines[1])
    assert re.match(r"^model/0\.weight\s+\(32, 64\)\s+float32\s+8\.0 KiB$", lines[2])
    assert re.match(r"^model/0\.bias\s+\(32,\)\s+float32\s+128 B$", lines[3])


def test_rollback_then_a_new_session_restores_that_step(tmp_path):
    saved = make_logdir(tmp_path)
    before = (tmp_path / "checkpoint").read_text()
    result = cli("rollback", tmp_path, 200)
    assert result.returncode == 0, result.stderr
    assert "now points at model.ckpt-200" in result.stdout and "model.ckpt-300" in result.stdout
    index = read_index(str(tmp_path))
    assert index.model_checkpoint_path == "model.ckpt-200"
    assert index.all_model_checkpoint_paths == read_index_text(before).all_model_checkpoint_paths
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]

    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with supervisor.MonitoredTrainingSession(str(tmp_path), model=model, save_checkpoint_secs=None,
                                             save_summaries_steps=None, log_step_count_steps=None) as s:
        assert s.global_step == 200
        for key, value in model.state_dict().items():
            assert torch.equal(value, saved[200][key])


def read_index_text(text):
    from supervisor.checkpoint.layout.index import parse_index
    return parse_index(text)


def test_rollback_refuses_bad_targets(tmp_path):
    make_logdir(tmp_path)
    flip_byte(tmp_path / "model.ckpt-200" / "state.pt")
    before = (tmp_path / "checkpoint").read_bytes()
    corrupt = cli("rollback", tmp_path, 200)
    assert corrupt.returncode == 1 and "fails verification" in corrupt.stderr
    absent = cli("rollback", tmp_path, 250)
    assert absent.returncode == 1 and "no checkpoint of step 250" in absent.stderr and "[100, 200, 300]" in absent.stderr
    assert (tmp_path / "checkpoint").read_bytes() == before


def test_rollback_and_prune_refuse_while_a_writer_holds_the_lock(tmp_path):
    make_logdir(tmp_path)
    before = (tmp_path / "checkpoint").read_bytes()
    writer = supervisor.CheckpointManager(str(tmp_path), max_to_keep=None)
    writer.open()  # a live writer: holds .supervisor.lock
    try:
        for args in (("rollback", tmp_path, 100), ("prune", tmp_path, "--keep", "1")):
            result = cli(*args)
            assert result.returncode == 1, result
            assert "refusing" in result.stderr and f"pid {os.getpid()}" in result.stderr
        dry = cli("prune", tmp_path, "--keep", "1", "--dry-run")  # reads only: allowed
        assert dry.returncode == 0 and "would delete 2" in dry.stdout
        assert (tmp_path / "checkpoint").read_bytes() == before
        assert sorted(os.listdir(tmp_path)).count("model.ckpt-100") == 1
        listed = cli("ls", tmp_path)  # readers never need the lock
        assert listed.returncode == 0 and f"a writer is active: pid {os.getpid()}" in listed.stdout
    finally:
        writer.close()
    assert cli("rollback", tmp_path, 100).returncode == 0  # the writer is gone: allowed now
    assert "writer is active" not in cli("ls", tmp_path).stdout


def test_prune_dry_run_deletes_nothing_and_prune_keeps_the_newest(tmp_path):
    make_logdir(tmp_path, steps=(100, 200, 300, 400))
    shutil.copytree(tmp_path / "model.ckpt-100", tmp_path / "model.ckpt-50")  # hand-copied: never touched
    assert cli("rollback", tmp_path, 200).returncode == 0
    listing, index = sorted(os.listdir(tmp_path)), (tmp_path / "checkpoint").read_bytes()
    dry = cli("prune", tmp_path, "--keep", "2", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete 1: model.ckpt-100" in dry.stdout and "nothing deleted" in dry.stdout
    assert sorted(os.listdir(tmp_path)) == listing and (tmp_path / "checkpoint").read_bytes() == index

    real = cli("prune", tmp_path, "--keep", "1")
    assert real.returncode == 0, real.stderr
    assert "deleted model.ckpt-100" in real.stdout and "deleted model.ckpt-300" in real.stdout
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith("model.ckpt"))
    assert left == ["model.ckpt-200", "model.ckpt-400", "model.ckpt-50"]  # newest + indexed + hand-copied
    index = read_index(str(tmp_path))
    assert index.model_checkpoint_path == "model.ckpt-200"
    assert index.all_model_checkpoint_paths == ("model.ckpt-200", "model.ckpt-400")
    assert len(index.all_model_checkpoint_timestamps) == 2
    assert cli("ls", tmp_path).returncode == 0


def test_rollback_discard_newer(tmp_path):
    make_logdir(tmp_path)
    result = cli("rollback", tmp_path, 100, "--discard-newer")
    assert result.returncode == 0, result.stderr
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("model.ckpt")) == ["model.ckpt-100"]
    index = read_index(str(tmp_path))
    assert index.model_checkpoint_path == "model.ckpt-100" and index.all_model_checkpoint_paths == ("model.ckpt-100",)


@pytest.mark.parametrize("args", [(), ("ls",), ("rollback", ".", "two"), ("prune", ".", "--keep", "0"),
                                  ("prune", "."), ("ls", ".", "--bogus"), ("frobnicate",)])
def test_usage_errors_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exit_info:  # in-process: argparse decides; one real run below
        main(list(args))
    assert exit_info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_usage_error_exit_code_of_the_real_process():
    result = cli("rollback", ".", "two", fresh=True)
    assert result.returncode == 2 and "STEP must be a non-negative integer" in result.stderr


def test_help_on_every_subcommand(capsys):
    for name in ("ls", "verify", "inspect", "rollback", "prune"):
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"], prog="torch-supervisor")
        assert exit_info.value.code == 0
        assert capsys.readouterr().out.startswith("usage: torch-supervisor " + name)
    top = cli("--help")
    assert top.returncode == 0 and top.stdout.startswith("usage: python -m supervisor")
    assert all(n in top.stdout for n in ("ls", "verify", "inspect", "rollback", "prune", "evaluate"))


def test_evaluate_is_wired_in_or_cleanly_unavailable():
    try:
        importlib.import_module("supervisor.cli.evaluate")
    except ModuleNotFoundError:
        result = cli("evaluate")
        assert result.returncode == 2 and "not available" in result.stderr
    else:
        assert cli("evaluate", "--help").returncode == 0


def test_console_script_entry_point():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.split(" = ") for line in config["options.entry_points"]["console_scripts"].strip().splitlines())
    module, function = scripts["torch-supervisor"].split(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0


def test_ls_while_a_writer_saves_and_deletes_underneath(tmp_path):
    """A logdir being written (every save deletes the previous checkpoint): the listing never
    reports a checkpoint retention deleted meanwhile as a failure."""
    import threading

    from supervisor.cli._common import scan_logdir

    model = torch.nn.Linear(256, 256)
    manager = supervisor.CheckpointManager(str(tmp_path), max_to_keep=1, save_mode="sync")
    manager.open()
    stop = threading.Event()
    saved = []

    def write():
        while not stop.is_set() and len(saved) < 60:
            manager.save(len(saved) + 1, supervisor.TrainingState.from_arguments(model=model))
            saved.append(1)

    writer = threading.Thread(target=write, name="test-writer")
    writer.start()
    try:
        scans = []
        while writer.is_alive():
            scans.append(scan_logdir(str(tmp_path)))
    finally:
        stop.set()
        writer.join()
        manager.close()
    failures = [(r.name, r.reason) for listing in scans for r in listing.rows if not r.verified]
    assert not failures, failures
    assert sum(len(listing.rows) for listing in scans) >= 20  # it did see checkpoints
