"""supervisor/'s root by concept (issue 32), read from the source so the layout cannot decay.

The root holds the façade, the foundation (errors, clock, validation, paths, scalars, console)
and the user-facing modules the documentation promises (``hook``, ``toolkit``, ``testing``,
``agreement``, ``summary``, ``metrics``); the rest lives in packages, each with its import rule:

- ``state/`` (the training state, RNG, exact resume, loop variables) imports nothing of ours but
  ``supervisor.errors``: the checkpoint and distributed packages stand on it;
- ``creators/`` (how a session starts: restore or initialise, and where it runs) never imports
  the engine, the front doors or anything above them;
- ``engine/`` (the session machinery) never imports the front doors or above;
- ``frontdoors/`` (``Supervisor``, ``MonitoredTrainingSession``) never imports the estimator, the
  command line or the hook library (``hooks`` stands above ``supervisor``'s own packages);
- no folder of supervisor/ or hooks/ holds more than `MAX_MODULES` modules besides ``__init__``.
"""
from __future__ import annotations

import pytest

from tests.core.test_house_rules import MODULES, ROOT, _imports, _target

pytestmark = pytest.mark.timeout(60)

MAX_MODULES = 15
#: package -> the only modules of ours it may import besides its own (prefixes).
MAY_IMPORT = {
    "supervisor.state": ("supervisor.errors",),
}
#: package -> the modules of ours it must never import (prefixes).
NEVER_IMPORTS = {
    "supervisor.creators": ("supervisor.engine", "supervisor.frontdoors", "supervisor.estimator", "supervisor.cli",
                            "hooks"),
    "supervisor.engine": ("supervisor.frontdoors", "supervisor.estimator", "supervisor.cli", "hooks"),
    "supervisor.frontdoors": ("supervisor.estimator", "supervisor.cli", "hooks"),
}


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _edges(package: str) -> list[tuple[str, str]]:
    """(module of ``package``, module of ours it imports outside the package), at any depth."""
    return sorted({(module, target) for module in MODULES if _inside(module, package)
                   for imported, name, _ in _imports(module)
                   if (target := _target(imported, name)) is not None and not _inside(target, package)})


def _disallowed(edges: list[tuple[str, str]], *, allowed=None, forbidden=()) -> list[tuple[str, str]]:
    return [(m, t) for m, t in edges
            if (allowed is not None and not any(_inside(t, a) for a in allowed))
            or any(_inside(t, f) for f in forbidden)]


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_the_package_imports_only_what_its_rule_allows(package):
    assert any(_inside(m, package) for m in MODULES), f"{package} has no module: update MAY_IMPORT"
    assert _disallowed(_edges(package), allowed=MAY_IMPORT[package]) == []


@pytest.mark.parametrize("package", sorted(NEVER_IMPORTS))
def test_the_package_never_imports_the_floors_above(package):
    assert any(_inside(m, package) for m in MODULES), f"{package} has no module: update NEVER_IMPORTS"
    assert _disallowed(_edges(package), forbidden=NEVER_IMPORTS[package]) == []


def test_the_rules_see_an_import_they_forbid():
    edges = [("supervisor.engine.session", "supervisor.frontdoors.supervisor"),
             ("supervisor.state.rng", "supervisor.clock"), ("supervisor.state.rng", "supervisor.errors")]
    assert _disallowed(edges, forbidden=NEVER_IMPORTS["supervisor.engine"]) == [edges[0]]
    assert _disallowed(edges[1:], allowed=MAY_IMPORT["supervisor.state"]) == [edges[1]]
    assert not _inside("supervisor.statefulness", "supervisor.state")


def test_no_folder_holds_more_than_fifteen_modules():
    folders = {path.parent for path in MODULES.values()}
    sizes = {folder.relative_to(ROOT).as_posix(): len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
             for folder in folders}
    assert {folder: n for folder, n in sizes.items() if n > MAX_MODULES} == {}
    assert sizes["supervisor"] <= MAX_MODULES


def test_the_public_names_keep_working_from_the_facade_and_the_documented_paths():
    import supervisor
    import supervisor.agreement
    import supervisor.state
    from supervisor.engine.session import MonitoredSession
    from supervisor.frontdoors.supervisor import Supervisor
    from supervisor.frontdoors.training_session import MonitoredTrainingSession
    from supervisor.state.loop_state import LoopState

    assert (supervisor.MonitoredSession, supervisor.Supervisor) == (MonitoredSession, Supervisor)
    assert (supervisor.MonitoredTrainingSession, supervisor.LoopState) == (MonitoredTrainingSession, LoopState)
    assert supervisor.TrainingState is supervisor.state.TrainingState
    assert callable(supervisor.agreement.register_rule)
