"""tools/reorg_checkpoint.py (issue 32): the script that moves supervisor/checkpoint/ into its
subpackages. Its rewriting rules on sample sources, and its table against the package as it
stands: every module named (before the move), or a refusal to run twice (after it)."""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reorg_checkpoint", ROOT / "tools" / "reorg_checkpoint.py")
reorg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reorg)

REDIRECTS = {("restore", "Restored"): ("supervisor.checkpoint.load.apply", "Restored"),
             ("restore", "find_and_load"): ("supervisor.checkpoint.load.choose", "find_and_load"),
             ("restore", "check_checkpoint"): ("supervisor.checkpoint.load.loader", "verify_checkpoint"),
             ("reading", "CheckpointVanishedError"): ("supervisor.errors", "CheckpointVanishedError"),
             **reorg.REDIRECTS}


def _rewrite(source: str) -> str:
    rewriter = reorg.Rewriter(REDIRECTS)
    text, generated = rewriter.imports(source, "sample.py")
    return reorg.compact(rewriter.text(rewriter.import_lines(text, "sample.py")), generated)


@pytest.mark.parametrize("source, expected", [
    # a shim's names come from the modules that define them, aliases and comments kept
    ("from supervisor.checkpoint.restore import Restored, check_checkpoint  # noqa: E402\n",
     "from supervisor.checkpoint.load.apply import Restored  # noqa: E402\n"
     "from supervisor.checkpoint.load.loader import verify_checkpoint as check_checkpoint  # noqa: E402\n"),
    # merged into an import of the same module the file has already (no line added)
    ("from supervisor.checkpoint.choose import load_chosen\nfrom supervisor.checkpoint.restore import find_and_load\n",
     "from supervisor.checkpoint.load.choose import load_chosen, find_and_load\n"),
    # a module imported through the package, beside the façade's names, inside a function
    ("def f():\n    from supervisor.checkpoint import dcp_commit, latest_checkpoint\n",
     "def f():\n    from supervisor.checkpoint.sharded import commit as dcp_commit\n"
     "    from supervisor.checkpoint import latest_checkpoint\n"),
    # the source of a subprocess, in a string
    ('run(f"""\n    import os\n    from supervisor.checkpoint import fileio, latest_checkpoint\n'
     '    from supervisor.checkpoint.restore import find_and_load\n""")\n',
     'run(f"""\n    import os\n    from supervisor.checkpoint.storage import fileio\n'
     '    from supervisor.checkpoint import latest_checkpoint\n    from supervisor.checkpoint.load.choose import find_and_load\n""")\n'),
    # a name re-exported from a higher floor comes from the module that defines it
    ("from supervisor.checkpoint.private_copy import MemoryFile, PrivateCopy\n",
     "from supervisor.checkpoint.formats.memory_file import MemoryFile\n"
     "from supervisor.checkpoint.load.private_copy import PrivateCopy\n"),
    # every other mention: dotted names (the seam keeps its own), strings, paths; tests' paths untouched
    ('import supervisor.checkpoint.loader as loader\nlogger = "supervisor.checkpoint.lease"\n'
     'x = "supervisor.checkpoint.storage.Storage, supervisor.checkpoint.storage_base, supervisor.checkpoint.storage_for"\n'
     "# supervisor/checkpoint/object_io.py checkpoint/dcp.py tests/checkpoint/lease_writer.py\n",
     'import supervisor.checkpoint.load.loader as loader\nlogger = "supervisor.checkpoint.ownership.lease"\n'
     'x = "supervisor.checkpoint.storage.Storage, supervisor.checkpoint.storage.base, supervisor.checkpoint.storage_for"\n'
     "# supervisor/checkpoint/storage/s3/objects.py checkpoint/sharded/__init__.py tests/checkpoint/lease_writer.py\n"),
])
def test_the_rewrite_of_a_sample(source, expected):
    assert _rewrite(source) == expected


def test_a_shim_imported_as_a_module_is_refused_by_name():
    with pytest.raises(SystemExit, match="sample.py:1: imports the shim 'restore'"):
        _rewrite("from supervisor.checkpoint import restore\n")


def test_the_table_against_the_package_as_it_stands():
    result = subprocess.run([sys.executable, "tools/reorg_checkpoint.py", "--dry-run"], cwd=ROOT,
                            capture_output=True, text=True, timeout=100)
    if (ROOT / "supervisor" / "checkpoint" / "layout").is_dir():  # applied: it refuses to run twice
        assert result.returncode == 2 and "the layout is applied already" in result.stderr, result.stderr
        return
    assert result.returncode == 0, result.stderr  # else: names the modules no table holds
    present = {p.stem for p in (ROOT / "supervisor" / "checkpoint").glob("*.py")} - {"__init__"}
    moved = {line.split()[2] for line in result.stdout.splitlines() if line.startswith("would move")}
    assert {f"supervisor/checkpoint/{m}.py" for m in present - set(reorg.FOLDED) - {"manager"}} == moved


def test_a_module_in_no_table_fails_the_run_naming_it():
    assert reorg.check_table({"__init__", "loader", "restore", "brand_new"}) == ["brand_new"]
