"""Counts the functions of ``supervisor/`` that take a tramp parameter (issue 32), and their files.

A tramp parameter is one a function only passes on: ``storage_options`` (the object-store
client's options, resolved into a `Storage` by whoever finally needs one), ``trusted_globals``
(the loader's allow-list) and ``clock``. Run it from the repository root::

    python tools/tramp_count.py            # a table: parameter, functions, files
    python tools/tramp_count.py --list     # and every function, as path::qualified.name

A function counts when the parameter is one of its own (positional or keyword-only), not when
it only forwards ``**kwargs``. Nested functions and methods count as functions.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import sys
from typing import Iterator

PARAMETERS = ("storage_options", "trusted_globals", "clock")
ROOT = pathlib.Path(__file__).resolve().parents[1]


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


def count(package: pathlib.Path) -> dict[str, list[str]]:
    """``{parameter: ["path::function", ...]}`` over every module under ``package``."""
    found: dict[str, list[str]] = {p: [] for p in PARAMETERS}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, node in _functions(tree):
            for parameter in sorted(set(PARAMETERS) & _parameters(node)):
                found[parameter].append(f"{path.relative_to(package.parent)}::{name}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="every function, not only the counts")
    parser.add_argument("package", nargs="?", default=str(ROOT / "supervisor"))
    args = parser.parse_args(argv)
    found = count(pathlib.Path(args.package).resolve())
    print(f"{'parameter':<18}{'functions':>10}{'files':>7}")
    for parameter, functions in found.items():
        files = {f.split("::", 1)[0] for f in functions}
        print(f"{parameter:<18}{len(functions):>10}{len(files):>7}")
    if args.list:
        for parameter, functions in found.items():
            print(f"\n{parameter}:", *functions, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
