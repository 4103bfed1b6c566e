"""The command line on the wrong path, the wrong kind of path and broken user code, run as a user
runs it: ``python -m supervisor ...`` in real processes (forked from an interpreter that imported
the CLI once, tests/zygote.py; the pipe test starts fresh ones) (issue 22 items 12-16, issue
21's CLI bad inputs). Every run is bounded by a timeout, so a command that waits forever fails."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

import supervisor
from supervisor.cli import build_parser
from tests import zygote
from tests.cli.helpers import ROOT, cli, cli_json, make_logdir

HELPERS = "tests.estimator.sidecar_helpers"
MODEL = ("--model", f"{HELPERS}:make_model", "--data", "tests.estimator.test_sidecar_evaluator:BATCHES.copy")
SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for `tool | head` when head exits first


@dataclass(frozen=True)
class Bad:
    """One bad input: the arguments (``{run}`` = a logdir with steps 100-300, ``{tmp}`` = its
    parent), the exit code, and what stderr must say (each substring, formatted likewise)."""

    args: tuple[str, ...]
    code: int
    says: tuple[str, ...]
    must_not_exist: str | None = None  # a path the command must not create
    unchanged: str | None = None       # a file the command must not change


BAD = {
    # 22.13: files that exist are not "missing": say what they are and what to pass
    "verify the index file": Bad(("verify", "{run}/checkpoint"), 2,
                                 ("{run}/checkpoint is the checkpoint index file of the log directory {run}",
                                  "verify {run}")),
    "verify a file of a checkpoint": Bad(("verify", "{run}/model.ckpt-200/state.pt"), 2,
                                         ("is a file of the checkpoint {run}/model.ckpt-200",
                                          "verify {run}/model.ckpt-200")),
    "verify a plain file": Bad(("verify", "{tmp}/notes.txt"), 2, ("{tmp}/notes.txt is a file", "not a checkpoint")),
    # 22.16: a parent of logdirs or a checkpoint directory is not a logdir: point at what was found
    "ls a parent of logdirs": Bad(("ls", "{tmp}"), 2, ("{tmp} is not a log directory", "{run}", "{tmp}/run2")),
    "verify a parent of logdirs": Bad(("verify", "{tmp}"), 2, ("{tmp} is not a log directory", "{run}")),
    "ls a checkpoint directory": Bad(("ls", "{run}/model.ckpt-200"), 2,
                                     ("{run}/model.ckpt-200 is a checkpoint directory", "ls {run}",
                                      "verify {run}/model.ckpt-200")),
    "ls the index file": Bad(("ls", "{run}/checkpoint"), 2, ("checkpoint index file of the log directory {run}",)),
    # 21: a file that is not a checkpoint: say so, not torch's advice about torch.save
    "inspect a text file": Bad(("inspect", "{tmp}/notes.txt"), 1, ("{tmp}/notes.txt is not a checkpoint",)),
    "inspect /etc/passwd": Bad(("inspect", "/etc/passwd"), 1, ("/etc/passwd is not a checkpoint",)),
    # 22.15: a reader never creates the logdir (it waits for the trainer to, saying so); a file
    # is a usage error, not a traceback
    "evaluate a mistyped logdir": Bad(("evaluate", "{tmp}/runn", *MODEL, "--timeout", "0.5", "--poll-secs", "0.05"), 0,
                                      ("waiting for the first checkpoint in {tmp}/runn, which does not exist yet",
                                       "never"), must_not_exist="{tmp}/runn"),
    "evaluate a logdir under a file": Bad(("evaluate", "{tmp}/notes.txt/run", *MODEL), 2,
                                          ("LOGDIR {tmp}/notes.txt/run can never exist: {tmp}/notes.txt is a file",),
                                          must_not_exist="{tmp}/notes.txt/run"),
    "evaluate the index file": Bad(("evaluate", "{run}/checkpoint", *MODEL), 2,
                                   ("checkpoint index file of the log directory {run}", "evaluate {run}")),
    "evaluate a checkpoint directory": Bad(("evaluate", "{run}/model.ckpt-200", *MODEL), 2,
                                           ("{run}/model.ckpt-200 is a checkpoint directory", "evaluate {run}")),
    "evaluate a parent of logdirs": Bad(("evaluate", "{tmp}", *MODEL), 2, ("{tmp} is not a log directory", "{run}")),
    # 21: --log-dir that cannot be a directory, refused before anything runs
    "evaluate --log-dir a file": Bad(("evaluate", "{run}", *MODEL, "--log-dir", "{tmp}/notes.txt"), 2,
                                     ("--log-dir {tmp}/notes.txt", "is a file")),
    "evaluate --log-dir under a file": Bad(("evaluate", "{run}", *MODEL, "--log-dir", "{tmp}/notes.txt/eval"), 2,
                                           ("--log-dir {tmp}/notes.txt/eval", "{tmp}/notes.txt is a file")),
    # 21: user code that fails: one line naming --model and the cause, exit 2
    "evaluate --model that raises": Bad(("evaluate", "{run}", "--model", "{tmp}/raises.py:model"), 2,
                                        ("--model {tmp}/raises.py:model", "RuntimeError: no GPU here",
                                         "raises.py, line 4")),
    "evaluate --model with a syntax error": Bad(("evaluate", "{run}", "--model", "{tmp}/syntax.py:model"), 2,
                                                ("--model {tmp}/syntax.py:model", "SyntaxError", "syntax.py, line 1")),
    "evaluate --model whose import raises": Bad(("evaluate", "{run}", "--model", "{tmp}/imports.py:model"), 2,
                                                ("--model {tmp}/imports.py:model", "ModuleNotFoundError",
                                                 "no_such_package_xyz")),
    "evaluate --data that raises": Bad(("evaluate", "{run}", "--model", "{tmp}/fits.py:model",
                                        "--data", "{tmp}/raises.py:model", "--max-evaluations", "1"), 1,
                                       ("--data {tmp}/raises.py:model", "RuntimeError: no GPU here")),
    # 21: rollback --basename is honoured: no checkpoint of that name, nothing changed
    "rollback --basename": Bad(("rollback", "{tmp}/run2", "200", "--basename", "foo"), 1,
                               ("no checkpoint named foo-200", "model.ckpt-100"), unchanged="{tmp}/run2/checkpoint"),
}


def _files(tmp) -> None:
    (tmp / "notes.txt").write_text("not a checkpoint\n")
    (tmp / "raises.py").write_text("import torch\n\ndef model():\n    raise RuntimeError('no GPU here')\n")
    (tmp / "fits.py").write_text("import torch\n\ndef model():\n    return torch.nn.Sequential(torch.nn.Linear(64, 32), "
                                 "torch.nn.ReLU(), torch.nn.Linear(32, 4))\n")  # make_logdir's model
    (tmp / "syntax.py").write_text("def model(:\n    pass\n")
    (tmp / "imports.py").write_text("import no_such_package_xyz\n\ndef model():\n    pass\n")


def _run(args: tuple[str, ...], values: dict[str, str]) -> subprocess.CompletedProcess:
    """One row's command in a real process, forked from an interpreter that imported the CLI
    once (tests/zygote.py)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [a.format(**values) for a in args]
    try:
        return zygote.run(argv, timeout=120, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:  # a command that waits forever: that row fails, the others run
        return subprocess.CompletedProcess(e.cmd, None, str(e.stdout), f"timed out after 120 s: {e.stderr}")


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """Runs every row of `BAD` once, four processes at a time."""
    tmp = tmp_path_factory.mktemp("bad")
    make_logdir(tmp / "run")
    shutil.copytree(tmp / "run", tmp / "run2")
    _files(tmp)
    values = {"run": str(tmp / "run"), "tmp": str(tmp)}
    before = {row.unchanged: open(row.unchanged.format(**values), "rb").read() for row in BAD.values() if row.unchanged}
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run, row.args, values) for name, row in BAD.items()}
        results = {name: f.result() for name, f in futures.items()}
    return results, values, before


@pytest.mark.timeout(900)  # the first row's setup runs every row: a few s on 2 idle cores (20 s when each
# row started its own interpreter and imported torch), minutes when loaded
@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(bad_runs, name):
    results, values, before = bad_runs
    row, result = BAD[name], results[name]
    shown = f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.returncode == row.code, shown
    assert "Traceback" not in result.stderr, shown
    for text in row.says:
        assert text.format(**values) in result.stderr, shown
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == (row.code != 0), shown  # one line naming the argument, the value and the fix
    if row.must_not_exist:
        assert not os.path.exists(row.must_not_exist.format(**values)), "a reader created the path"
    if row.unchanged:
        after = open(row.unchanged.format(**values), "rb").read()
        assert after == before[row.unchanged], "a refused command changed it"


# ---------------------------------------------------------------- 22.12
def test_verify_one_checkpoint_reports_its_index_membership(tmp_path):
    make_logdir(tmp_path, steps=(100, 200, 300))
    result, rows = cli_json("verify", tmp_path / "model.ckpt-200")
    assert result.returncode == 0, result.stderr
    assert rows[0]["in_index"] is True and rows[0]["indexed"] is False
    _, listed = cli_json("ls", tmp_path)
    assert {k: v for k, v in rows[0].items()} == next(r for r in listed if r["step"] == 200)
    latest, rows = cli_json("verify", tmp_path / "model.ckpt-300")
    assert rows[0]["in_index"] is True and rows[0]["indexed"] is True
    shutil.copytree(tmp_path / "model.ckpt-100", tmp_path / "model.ckpt-50")  # a hand copy: not listed
    _, rows = cli_json("verify", tmp_path / "model.ckpt-50")
    assert rows[0]["verified"] is True and rows[0]["in_index"] is False and rows[0]["indexed"] is False


# ---------------------------------------------------------------- 22.14
def test_output_into_a_pipe_closed_early_exits_quietly(tmp_path):
    """``ls --json`` into a pipe nobody reads, and ``inspect --json | head -2`` through a real
    shell pipeline: no traceback, the status a shell gives a tool that head cut short."""
    make_logdir(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        # fresh interpreters here: the status 141 of a closed pipe is the interpreter's own exit
        result = subprocess.run([sys.executable, "-m", "supervisor", "ls", str(tmp_path / "run"), "--json"],
                                stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write_end)
    assert result.returncode == SIGPIPE_STATUS and result.stderr == "", result.stderr

    big = tmp_path / "big.pt"  # ~3,000 variables: far more than a pipe's 64 KiB buffer
    torch.save({f"layer{i}.weight": torch.zeros(1) for i in range(3000)}, big)
    script = f"set -o pipefail; {sys.executable} -m supervisor inspect {big} --json | head -2"
    piped = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert piped.stdout.splitlines() == ["{", '  "step": null,'], piped.stdout
    assert piped.returncode == SIGPIPE_STATUS and "Traceback" not in piped.stderr and piped.stderr == "", piped.stderr
    whole = cli("inspect", big, "--json")  # unpiped, the same command prints everything
    assert whole.returncode == 0 and len(json.loads(whole.stdout)["variables"]) == 3000


# ---------------------------------------------------------------- 22.15
def test_evaluate_says_what_it_waits_for(tmp_path):
    """An existing logdir without a checkpoint yet: the evaluator says it waits for the first
    one (naming the path) instead of waiting in silence, and creates nothing in it."""
    logdir = tmp_path / "fresh"
    logdir.mkdir()
    result = cli("evaluate", logdir, *MODEL, "--timeout", "0.3", "--poll-secs", "0.05")
    assert result.returncode == 0, result.stderr
    assert f"waiting for the first checkpoint in {logdir}" in result.stderr
    assert "stopped (timeout): 0 evaluated" in result.stdout
    assert os.listdir(logdir) == []


# ---------------------------------------------------------------- 22.16
def test_help_shows_no_markup():
    parser, modules = build_parser("torch-supervisor")
    subparsers = next(a for a in parser._actions if a.choices and "ls" in a.choices)
    for name, sub in subparsers.choices.items():
        text = sub.format_help()
        assert "``" not in text and "`supervisor" not in text, (name, text)
    evaluate_help = cli("evaluate", "--help")
    assert evaluate_help.returncode == 0 and "``" not in evaluate_help.stdout
    assert "the metrics to LOGDIR/eval" in evaluate_help.stdout


def test_json_output_is_one_array_of_one_object_per_checkpoint(tmp_path):
    """The README's promise (SPEC §13): ``ls``/``verify --json`` print one JSON array with one
    object per checkpoint; ``inspect --json`` one object (it reads one checkpoint)."""
    make_logdir(tmp_path, steps=(1, 2))
    for command in ("ls", "verify"):
        result, rows = cli_json(command, tmp_path)
        assert isinstance(rows, list) and [r["step"] for r in rows] == [1, 2]
    readme = " ".join(open(os.path.join(ROOT, "docs", "guides", "cli.md"), encoding="utf-8").read().split())
    assert "prints one JSON array with one object per checkpoint" in readme
    assert "prints one object per checkpoint" not in readme
    assert supervisor.__file__.startswith(ROOT)
