"""The storage seam's rule (issue 23, SPEC §16), read from the source (no import runs): in
supervisor/checkpoint/, only the storage implementations touch the filesystem. Every other
module goes through `supervisor.checkpoint.storage.Storage`, so an object-store logdir (s3://)
takes the same code path as a local one.

A module "touches the filesystem" when it calls ``os.open``/``os.rename``/``os.replace``/
``os.fsync``/``os.unlink``/``os.remove``/``os.rmdir``/``os.mkdir``/``os.makedirs``/
``os.listdir``/``os.scandir``/``os.walk``/``os.link``, anything of ``shutil``, or the builtin
``open(`` — or imports one of those names from ``os``/``shutil``.

`EXEMPT` are the implementations of the seam; `NOT_YET_ROUTED` the read-side modules still to be
routed through it (remove a name once its module is: the test then holds it to the rule).
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "supervisor" / "checkpoint"


def _name(path: pathlib.Path) -> str:
    """A module's dotted name inside the package (``storage.local``; a subpackage's face by its own)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


#: The storage implementations and the POSIX helpers they are built on.
EXEMPT = {"storage.local", "storage.local_snapshot", "storage.s3.store", "storage.s3.objects", "storage.s3.errors", "storage.fileio", "ownership.lock", "ownership.lease",
          "ownership.holder",  # holder: reads this host's /proc (boot id, a pid's start time), never a logdir
          "storage.s3.key_cache"}  # this user's cache of the s3 client's option keys, never a logdir
#: Modules still to be routed through Storage (none: the read path goes through it since the
#: one verified loader, loader.py). A module added here needs its reason next to it.
NOT_YET_ROUTED: set[str] = set()

FORBIDDEN_OS = {"open", "rename", "renames", "replace", "fsync", "fdatasync", "unlink", "remove", "rmdir",
                "removedirs", "mkdir", "makedirs", "listdir", "scandir", "walk", "link", "symlink"}


def _offences(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "shutil"]
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil"):
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if node.module == "shutil" or a.name in FORBIDDEN_OS]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                found.append(f"open( at line {node.lineno}")
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id == "os" and func.attr in FORBIDDEN_OS) or func.value.id == "shutil":
                    found.append(f"{func.value.id}.{func.attr}( at line {node.lineno}")
    where = path.relative_to(PACKAGE) if PACKAGE in path.parents else path.name
    return [f"{where}: {o}" for o in found]


def test_only_the_storage_implementations_touch_the_filesystem():
    checked = [p for p in sorted(PACKAGE.rglob("*.py")) if _name(p) not in EXEMPT | NOT_YET_ROUTED]
    assert len(checked) >= 15  # the write path: temp, commit, index, publish, manager, finished...
    offending = [o for p in checked for o in _offences(p)]
    assert offending == [], "call the logdir's Storage instead:\n" + "\n".join(offending)


def test_the_exempt_lists_name_existing_modules():
    modules = {_name(p) for p in PACKAGE.rglob("*.py")}
    assert EXEMPT <= modules and NOT_YET_ROUTED <= modules, (EXEMPT | NOT_YET_ROUTED) - modules


def test_the_rule_sees_what_it_forbids(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os, shutil\nfrom os import rename\nos.replace('a', 'b')\nshutil.rmtree('x')\n"
                      "with open('f') as f:\n    pass\nos.path.join('a', 'b')\n", encoding="utf-8")
    assert [o.split(": ", 1)[1] for o in _offences(sample)] == [
        "import shutil", "from os import rename", "os.replace( at line 3", "shutil.rmtree( at line 4",
        "open( at line 5"]
