"""supervisor/events is the one place that knows TensorBoard's events format (issue 23), read
from the source (no import runs):

- it imports only the standard library, its own modules, the storage seam
  (``supervisor.checkpoint.storage``: every read and write of the runtime goes through it, SPEC
  §16, events included) and (lazily) tensorboard;
- no private name (``_x``) is imported from another of its modules;
- nothing else in supervisor/ or hooks/ frames records, computes their CRC or parses/loads
  events files (tensorboard's protobufs, CRC or loaders).
"""
from __future__ import annotations

import ast
import pathlib
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "supervisor" / "events"
FORMAT_MODULES = ("tensorboard.compat.proto", "tensorboard.compat.tensorflow_stub",
                  "tensorboard.backend.event_processing", "tensorboard.summary")


def _imports(path: pathlib.Path) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every absolute import in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def test_events_imports_only_the_standard_library_itself_the_storage_seam_and_tensorboard():
    offending = [f"{path.name} imports {module}" for path in sorted(PACKAGE.glob("*.py"))
                 for module, _ in _imports(path)
                 if module.split(".")[0] not in sys.stdlib_module_names
                 and not module.startswith(("supervisor.events", "tensorboard"))
                 and module != "supervisor.checkpoint.storage"]
    assert offending == []


def test_events_imports_no_private_name_from_another_module():
    offending = [f"{path.name}: {name} from {module}" for path in sorted(PACKAGE.glob("*.py"))
                 for module, names in _imports(path) for name in names
                 if name.startswith("_") and not name.startswith("__")]
    assert offending == []


def test_only_supervisor_events_touches_the_events_format():
    sources = [p for d in ("supervisor", "hooks") for p in sorted((ROOT / d).rglob("*.py"))
               if PACKAGE not in p.parents]
    offending = [f"{p.relative_to(ROOT)} imports {module}" for p in sources for module, _ in _imports(p)
                 if module.startswith(FORMAT_MODULES)]
    assert offending == []
