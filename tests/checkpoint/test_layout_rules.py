"""The subpackages of supervisor/checkpoint and which may import which (docs/architecture.md,
issue 32), read from the source (no import runs).

Floors, from the ground up: ``storage`` (the seam and its backends) -> ``ownership`` (lock,
lease) -> ``layout`` (names, manifest, index, finished mark, retention, verify, fencing) ->
``formats`` (state.pt, DCP, safe unpickling) -> ``load`` and ``save`` (side by side, neither
imports the other) -> ``manager`` -> ``sharded`` -> the façade ``__init__``. A unit imports its
own modules and those of the units in its row of `MAY_IMPORT`, at module level or in a function
(a lazy import hides an arrow, it does not remove it), ``TYPE_CHECKING`` imports aside.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "supervisor" / "checkpoint"
DOTTED = "supervisor.checkpoint"

#: unit -> the units it may import (besides itself). A unit is a subpackage, or a module of the
#: package's own floor (``manager``, ``arguments``); ``__init__`` is the façade.
MAY_IMPORT: dict[str, set[str]] = {
    "storage": set(),
    "ownership": {"storage"},
    "layout": {"storage", "ownership"},
    "formats": {"storage", "layout"},
    "arguments": {"storage"},
    "load": {"storage", "layout", "formats"},
    "save": {"storage", "ownership", "layout", "formats", "arguments"},
    "manager": {"storage", "ownership", "layout", "formats", "arguments", "load", "save"},
    "sharded": {"storage", "ownership", "layout", "formats", "arguments", "load", "save", "manager"},
    "tiers": {"storage", "ownership", "layout", "formats", "arguments", "load", "save", "manager", "sharded"},
    "__init__": {"storage", "ownership", "layout", "formats", "arguments", "load", "save", "manager", "sharded", "tiers"},
}
MAX_MODULES_PER_FOLDER = 15
#: The s3:// backend is reached through the seam only (``storage_for`` / ``register_scheme``).
S3 = f"{DOTTED}.storage.s3"


def _dotted(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_dotted(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def unit_of(module: str) -> str | None:
    """The unit of a module of the package (None: not one of the package's)."""
    if module == DOTTED:
        return "__init__"
    if not module.startswith(DOTTED + "."):
        return None
    return module[len(DOTTED) + 1:].split(".")[0]


def imported_modules(tree: ast.AST, known) -> list[tuple[str, int]]:
    """(module of the package, line) of every import, at any depth, but ``if TYPE_CHECKING:``'s;
    ``from pkg import sub`` names ``pkg.sub`` when that is a module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                subs = [f"{child.module}.{a.name}" for a in child.names if f"{child.module}.{a.name}" in known]
                found.extend((m, child.lineno) for m in subs or [child.module])
            visit(child)

    visit(tree)
    return [(m, line) for m, line in found if unit_of(m) is not None]


def offences(importer: str, tree: ast.AST, known) -> list[str]:
    unit = unit_of(importer)
    found = []
    for module, line in imported_modules(tree, known):
        target = unit_of(module)
        if target != unit and target not in MAY_IMPORT.get(unit, set()):
            found.append(f"{importer}:{line} ({unit}) imports {module} ({target})")
    return found


def test_each_unit_imports_only_the_units_it_stands_on():
    found = [o for name, path in MODULES.items() for o in offences(name, ast.parse(path.read_text("utf-8")), MODULES)]
    assert found == [], "see docs/architecture.md, the map of supervisor/checkpoint:\n" + "\n".join(found)


def test_the_rules_name_every_unit_and_no_other():
    units = {unit_of(name) for name in MODULES}
    assert units == set(MAY_IMPORT), (units ^ set(MAY_IMPORT))


def test_the_floors_are_an_order_without_circles():
    seen: set[str] = set()
    for unit in sorted(MAY_IMPORT, key=lambda u: len(MAY_IMPORT[u])):
        assert MAY_IMPORT[unit] <= seen, (unit, MAY_IMPORT[unit] - seen)
        seen.add(unit)
    assert "load" not in MAY_IMPORT["save"] and "save" not in MAY_IMPORT["load"]


def test_no_folder_holds_more_than_15_modules():
    folders: dict[pathlib.Path, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    over = {str(f.relative_to(PACKAGE)): n for f, n in folders.items() if n > MAX_MODULES_PER_FOLDER}
    assert over == {}


def test_the_s3_backend_is_reached_only_through_the_seam():
    root = PACKAGE.parent.parent
    sources = [p for d in ("supervisor", "hooks") for p in sorted((root / d).rglob("*.py"))]
    found = [f"{p.relative_to(root)} imports {m}" for p in sources
             if not _dotted_anywhere(p, root).startswith((S3, f"{DOTTED}.storage"))
             for m, _ in imported_modules(ast.parse(p.read_text("utf-8")), MODULES) if m.startswith(S3)]
    assert found == []


def _dotted_anywhere(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("importer, source, expected", [
    (f"{DOTTED}.storage.local", f"from {DOTTED}.layout.format import STATE_FILE", 1),  # a floor up
    (f"{DOTTED}.load.loader", f"def f():\n    from {DOTTED}.save import temp", 1),  # lazily, through the package
    (f"{DOTTED}.save.commit", f"from {DOTTED}.load.loader import read_checkpoint", 1),  # sideways
    (f"{DOTTED}.save.commit", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              f"    from {DOTTED}.load.loader import LoadedCheckpoint", 0),
    (f"{DOTTED}.layout.fencing", f"from {DOTTED}.ownership.lease import LeaseLostError", 0),
    (f"{DOTTED}.manager", f"from {DOTTED} import CheckpointManager", 1),  # the façade is the top
])
def test_the_rule_sees_what_it_forbids(importer, source, expected):
    known = set(MODULES) | {f"{DOTTED}.save.temp"}
    assert len(offences(importer, ast.parse(source), known)) == expected
