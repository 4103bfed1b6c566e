"""The engine's import rules (issue 23), read from the source so the plan cannot silently decay:
the checkpoint package never imports the engine, hooks or the upper floors; ``hooks`` imports
the hook protocol, never the ``supervisor`` package's front doors; the engine imports no private
name from another module, and has no function-level import of this project's modules (each one
hid an import circle)."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: The engine and the front doors (each module of their packages), the hook protocol, the agreement
#: rules and the training state: no private name of another module, no lazy import of ours.
ENGINE = ["agreement.py", "hook.py", "engine", "frontdoors", "state", "creators", "distributed"]
ABOVE_CHECKPOINT = ("supervisor.agreement", "supervisor.hook", "supervisor.engine", "supervisor.frontdoors",
                    "supervisor.estimator", "supervisor.cli", "hooks")


def _imports(path: pathlib.Path) -> list[tuple[str, list[str], bool]]:
    """(module, names, at module level) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    # Module level: the body, and what a top-level `if TYPE_CHECKING:` or `try:` holds.
    top = {id(node) for node in tree.body}
    for block in tree.body:
        if isinstance(block, (ast.If, ast.Try)):
            top |= {id(node) for node in block.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [a.name for a in node.names], id(node) in top))
    return found


def _ours(module: str) -> bool:
    return module == "hooks" or module.startswith(("hooks.", "supervisor"))


@pytest.mark.parametrize("path", sorted((ROOT / "supervisor" / "checkpoint").rglob("*.py")),
                         ids=lambda p: p.relative_to(ROOT / "supervisor" / "checkpoint").as_posix())
def test_the_checkpoint_package_never_imports_the_engine_or_above(path):
    bad = [m for m, _, _ in _imports(path) if m.startswith(ABOVE_CHECKPOINT)]
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted((ROOT / "hooks").glob("*.py")), ids=lambda p: p.name)
def test_hooks_import_the_protocol_never_the_supervisor_package_itself(path):
    bad = [m for m, names, _ in _imports(path) if m == "supervisor" and (not names or set(names) - {"_validate"})]
    bad += [m for m, _, _ in _imports(path) if m.startswith(("supervisor.engine", "supervisor.frontdoors",
                                                             "supervisor.estimator"))]
    assert not bad, f"hooks/{path.name} imports {bad}"


def _engine_modules() -> list[pathlib.Path]:
    found = []
    for entry in ENGINE:
        path = ROOT / "supervisor" / entry
        found += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return found


@pytest.mark.parametrize("path", _engine_modules(), ids=lambda p: p.relative_to(ROOT / "supervisor").as_posix())
def test_the_engine_imports_no_private_name_and_nothing_of_ours_lazily(path):
    found = _imports(path)
    private = [(m, n) for m, names, _ in found if _ours(m) for n in names if n.startswith("_") and n != "_validate"]
    lazy = [m for m, _, top in found if _ours(m) and not top]
    assert not private, f"{path} imports private names {private}"
    assert not lazy, f"{path} imports {lazy} inside a function"


@pytest.mark.parametrize("path", sorted((ROOT / "supervisor" / "distributed").glob("*.py")), ids=lambda p: p.name)
def test_the_distributed_package_never_imports_the_checkpoint_package_or_above(path):
    """Issue 32: `checkpoint/` imports `distributed/` (rank, RNG, the restore channel); the waits
    for the chief's committed step read the checkpoint index, so they live in `creators/`."""
    above = ("supervisor.checkpoint", "supervisor.creators", "supervisor.engine", "supervisor.frontdoors",
             "supervisor.estimator", "supervisor.cli", "hooks")
    bad = [m for m, _, _ in _imports(path) if m.startswith(above)]
    assert not bad, f"distributed/{path.name} imports {bad}"


def test_the_waits_first_address_still_works():
    import supervisor.creators
    from supervisor.distributed import committed_step, wait_for_global_step

    assert (wait_for_global_step, committed_step) == (supervisor.creators.wait_for_global_step,
                                                      supervisor.creators.committed_step)
