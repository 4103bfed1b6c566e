"""The import rules of supervisor/checkpoint (issue 23), read from the source (no import runs).

- It never imports the engine or the front doors: the session, boundary, hooks, the agreement,
  the estimator, the CLI.
- No import circle between its modules (function-level imports count: they only hide a circle).
- No private name (``_x``) imported from another of its modules.

Pairs that another slice of the redesign is removing are listed in KNOWN_*; the tests check that
nothing is added to them.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "supervisor" / "checkpoint"
FORBIDDEN = ("supervisor.engine.session", "supervisor.engine.boundary", "supervisor.hook", "supervisor.agreement",
             "supervisor.engine.dispatch", "supervisor.engine.lifecycle", "supervisor.engine.coordinator", "supervisor.frontdoors.services",
             "supervisor.frontdoors.supervisor", "supervisor.frontdoors.training_session", "supervisor.estimator", "supervisor.cli",
             "supervisor.distributed.agreement", "hooks")
KNOWN_CIRCLES: set = set()
KNOWN_PRIVATE: set = set()


def _imports(path: pathlib.Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every import in ``path``, at any depth, but those under
    ``if TYPE_CHECKING:`` (annotations only: no import at run time)."""
    found: list[tuple[str, tuple[str, ...]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, ()) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, tuple(alias.name for alias in child.names)))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _dotted(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Every module of the package (subpackages included) by its dotted name -> its imports."""
    return {_dotted(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _internal(module: str, names: tuple[str, ...], known: set[str]) -> list[str]:
    """The checkpoint modules an import statement names (``from supervisor.checkpoint.x import y``
    names module ``x.y`` when it is one, else ``x``)."""
    subs = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    return subs or ([module] if module in known else [])

def test_checkpoint_never_imports_the_engine_or_the_front_doors():
    offending = [f"{name} imports {module}" for name, imports in _modules().items()
                 for module, _ in imports
                 if any(module == f or module.startswith(f + ".") for f in FORBIDDEN)]
    assert offending == []


def test_no_import_circle_inside_checkpoint():
    modules = _modules()
    facade = "supervisor.checkpoint"
    graph = {name: {t for m, names in imports for t in _internal(m, names, set(modules)) if t != name} - {facade}
             for name, imports in modules.items() if name != facade}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reach = {stem: reaches(stem) for stem in graph}
    circles = {frozenset({a} | {b for b in reach[a] if a in reach.get(b, ())}) for a in graph if a in reach[a]}
    assert circles <= KNOWN_CIRCLES, sorted(sorted(c) for c in circles - KNOWN_CIRCLES)


def _private_uses(path: pathlib.Path, known: set[str]) -> set[tuple[str, str]]:
    """(module, name) of every ``module._name`` where ``module`` is a checkpoint module bound by
    ``from supervisor.checkpoint import module [as alias]``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module
               for alias in node.names if f"{node.module}.{alias.name}" in known}
    return {(aliases[node.value.id], node.attr) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__")}


def test_no_private_name_imported_across_checkpoint_modules():
    modules = _modules()
    found = {(importer, target, name) for importer, imports in modules.items() for module, names in imports
             for target in _internal(module, names, set(modules)) if target != importer
             for name in names if name.startswith("_") and target == module}
    found |= {(_dotted(path), target, name) for path in sorted(PACKAGE.rglob("*.py"))
              for target, name in _private_uses(path, set(modules)) if target != _dotted(path)}
    assert found <= KNOWN_PRIVATE, sorted(found - KNOWN_PRIVATE)
