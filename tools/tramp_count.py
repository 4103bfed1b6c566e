"""Counts the functions of ``supervisor/`` that take a tramp parameter (issue 32), and their files.

A tramp parameter is one a function only passes on: ``storage_options`` (the object-store
client's options, resolved into a `Storage` by whoever finally needs one), ``trusted_globals``
(the loader's allow-list), ``unpickling`` (the record the allow-list is resolved into, `Unpickling`:
counted under its own name so that a rename never looks like a removal) and ``clock``. Run it from
the repository root::

    python tools/tramp_count.py            # a table: parameter, functions, files (all; inside)
    python tools/tramp_count.py --list     # and every function, as path::qualified.name

A function counts when the parameter is one of its own (positional or keyword-only), not when
it only forwards ``**kwargs``. Nested functions and methods count as functions. ``inside``: the
ones that are not an entry point, where a parameter can only have been handed down: an entry
point is a name the documented packages export (`PUBLIC`: ``supervisor``, ``hooks``,
``supervisor.estimator``, ``supervisor.sinks``, ``supervisor.toolkit``; a class's methods with it),
or a command of the CLI (``supervisor/cli/<verb>.py::main``). The public ones keep accepting
``storage_options`` where users pass it. ``tramps``: the inside ones that only pass the parameter
on (every use of it is an argument of a call; `only_passes_on`), marked ``~`` by ``--list``.
``resolve``: those tramps whose every call that receives the parameter is one of its resolvers
(`ENDS`: for ``storage_options`` `RESOLVERS`, the calls that turn a directory and its options into
a `Location`/`Storage`; for ``trusted_globals`` `UNPICKLING_RESOLVERS`, the record's making): the
parameter ends there, resolved once for that call, instead of being carried further down; marked
``=`` by ``--list`` (a public reader of a module outside `PUBLIC`, or a backend's factory).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pathlib
import sys
from typing import Iterator

#: ``unpickling``: the record the loader's allow-list travels in (`Unpickling`, issue 32), counted
#: under its own name so that a rename never looks like a removal.
PARAMETERS = ("storage_options", "trusted_globals", "unpickling", "clock")
PUBLIC = ("supervisor", "hooks", "supervisor.estimator", "supervisor.sinks", "supervisor.toolkit")
ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Where ``storage_options`` end: the calls that resolve a directory (with its client's options)
#: into a `Location` or `Storage`, check them, or build the backend's client from them.
RESOLVERS = ("storage_for", "resolve_location", "check_location", "check_storage", "locate_logdir", "check_logdir",
             "locate", "resolve_storage", "watched_location", "check_options", "default_options", "split_options",
             "_check_options", "resolve_directory")
#: Where ``trusted_globals`` end: the calls that check the allow-list or resolve it into the
#: record (`Unpickling`: NumPy's safe globals and the user's, once).
UNPICKLING_RESOLVERS = ("Unpickling", "check_trusted_globals")
ENDS = {"storage_options": RESOLVERS, "trusted_globals": UNPICKLING_RESOLVERS}


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def _parameters(node: ast.AST) -> set[str]:
    args = node.args  # type: ignore[attr-defined]
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def only_passes_on(node: ast.AST, parameter: str) -> bool:
    """Whether every use of ``parameter`` in ``node``'s body is an argument of a call (it is only
    handed down: a tramp), not read, tested or resolved here."""
    passed, used = 0, 0
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            values = [*inner.args, *(k.value for k in inner.keywords)]
            passed += sum(isinstance(a, ast.Name) and a.id == parameter for a in values)
        elif isinstance(inner, ast.Name) and inner.id == parameter and isinstance(inner.ctx, ast.Load):
            used += 1
    return used > 0 and used == passed


def only_resolves(node: ast.AST, parameter: str) -> bool:
    """Whether every call ``parameter`` is passed to is one of its resolvers (`ENDS`: it ends there)."""
    callees = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            values = [*inner.args, *(k.value for k in inner.keywords)]
            if any(isinstance(a, ast.Name) and a.id == parameter for a in values):
                func = inner.func
                callees.add(func.id if isinstance(func, ast.Name) else getattr(func, "attr", ""))
    return bool(callees) and callees <= set(ENDS.get(parameter, ()))


def count(package: pathlib.Path) -> dict[str, list[str]]:
    """``{parameter: ["path::function", ...]}`` over every module under ``package`` (``~`` before
    the path: the function only passes the parameter on, `only_passes_on`)."""
    found: dict[str, list[str]] = {p: [] for p in PARAMETERS}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, node in _functions(tree):
            for parameter in sorted(set(PARAMETERS) & _parameters(node)):
                mark = "~" if only_passes_on(node, parameter) else ""
                if mark and only_resolves(node, parameter):
                    mark = "~="
                found[parameter].append(f"{mark}{path.relative_to(package.parent)}::{name}")
    return found


def entry_points(root: pathlib.Path) -> set[str]:
    """``path::name`` of every class and function the `PUBLIC` packages export (as defined)."""
    sys.path.insert(0, str(root))
    found = set()
    for package in PUBLIC:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = inspect.unwrap(getattr(module, name))
            try:
                path = pathlib.Path(inspect.getsourcefile(obj)).resolve().relative_to(root)
            except (TypeError, ValueError):
                continue  # a constant, or defined outside the repository
            found.add(f"{path}::{obj.__qualname__}")
    return found


def is_inside(function: str, entries: set[str]) -> bool:
    """Whether ``path::qualified.name`` is no entry point (nor a method of an exported class)."""
    function = function.lstrip("~=")
    path, name = function.split("::", 1)
    if path.startswith("supervisor/cli/") and name == "main":
        return False
    return not any(function == e or function.startswith(e + ".") for e in entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="every function, not only the counts")
    parser.add_argument("package", nargs="?", default=str(ROOT / "supervisor"))
    args = parser.parse_args(argv)
    package = pathlib.Path(args.package).resolve()
    found, entries = count(package), entry_points(package.parent)
    print(f"{'parameter':<18}{'functions':>10}{'files':>7}{'inside':>8}{'files':>7}{'tramps':>8}{'files':>7}"
          f"{'resolve':>9}{'files':>7}")
    for parameter, functions in found.items():
        inside = [f for f in functions if is_inside(f, entries)]
        tramps = [f for f in inside if f.startswith("~")]
        resolve = [f for f in tramps if f.startswith("~=")]
        counts = [(len(fs), len({f.lstrip("~=").split("::", 1)[0] for f in fs}))
                  for fs in (functions, inside, tramps, resolve)]
        print(f"{parameter:<18}" + "".join(f"{n:>{w}}{k:>7}" for (n, k), w in zip(counts, (10, 8, 8, 9))))
    if args.list:
        for parameter, functions in found.items():
            print(f"\n{parameter} (* inside):", *(("* " if is_inside(f, entries) else "  ") + f for f in functions),
                  sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
