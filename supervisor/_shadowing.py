"""Clear errors when a user's own ``hooks.py`` / ``supervisor.py`` shadows this project's packages.

The import names ``supervisor`` and ``hooks`` are short and common: a ``hooks.py`` next to a
training script (the script's directory comes first on ``sys.path``) is imported instead of the
built-in hook library, and supervisord's ``supervisor`` package, or a ``supervisor.py``, instead
of the runtime. Each package carries a marker, checked where the other one is imported, so the
failure names the shadowing file and the fix instead of an ``AttributeError`` deep inside.
"""
from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MARKER", "check_is_ours", "import_builtin_hooks"]

#: Set at the top of ``supervisor/__init__.py`` and ``hooks/__init__.py``.
MARKER = "__torch_supervisor_package__"


def check_is_ours(module: ModuleType, name: str) -> ModuleType:
    """Returns ``module`` if it is this project's package ``name``; else raises `ImportError`
    naming the file that was imported instead and the fix."""
    if getattr(module, MARKER, False):
        return module
    where = getattr(module, "__file__", None) or "(no file: a namespace package or a module object)"
    if name == "supervisor":
        fix = ("rename your supervisor.py (e.g. to my_supervisor.py), or uninstall supervisord's `supervisor` "
               "package: it cannot share an environment with torch-supervisor")
    else:
        fix = f"rename your {name}.py (e.g. to my_{name}.py) or move it out of the script's directory"
    raise ImportError(f"import {name!r} found {where}, which is not torch-supervisor's {name!r} package but "
                      f"shadows it (it comes first on sys.path); {fix}")


def import_builtin_hooks() -> ModuleType:
    """``import hooks`` for a factory that assembles default hooks, checked (see module doc)."""
    return check_is_ours(importlib.import_module("hooks"), "hooks")
