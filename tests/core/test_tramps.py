"""Issue 32's tramp parameters, held where they are (tools/tramp_count.py, docs/architecture.md):
``storage_options`` ends in a resolver wherever an inside function takes it; the loader's
allow-list travels as one record (`Unpickling`), counted under its own name too, so a rename
never looks like a removal; and the checkpoint options reach the tier managers as typed keywords,
never as an untyped ``**options`` dict."""
from __future__ import annotations

import importlib.util
import inspect
import pathlib

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tramp_count", ROOT / "tools" / "tramp_count.py")
tramp_count = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tramp_count)


@pytest.fixture(scope="module")
def counted() -> dict[str, list[str]]:
    """``{parameter: [inside functions taking it]}`` (marks kept: ``~`` tramp, ``~=`` resolves)."""
    found, entries = tramp_count.count(ROOT / "supervisor"), tramp_count.entry_points(ROOT)
    return {p: [f for f in fs if tramp_count.is_inside(f, entries)] for p, fs in found.items()}


def test_the_record_is_counted_under_its_own_name(counted):
    assert "unpickling" in tramp_count.PARAMETERS
    assert counted["unpickling"], "the load chain takes the record: the tool must see it"


def test_storage_options_inside_end_in_a_resolver(counted):
    carried = [f for f in counted["storage_options"] if f.startswith("~") and not f.startswith("~=")]
    assert carried == [], f"these hand storage_options down without resolving them: {carried}"


def test_the_allow_list_is_not_handed_down_the_load_chain(counted):
    """``trusted_globals`` ends where a read starts (resolved into the record, `Unpickling`); the
    load chain below takes the record. Inside functions that only hand either name on: counted
    (the manager constructors and factories that give the public ``trusted_globals`` to the
    manager that resolves it, and the load chain handing the record to its one ``load``)."""
    carried = [f for name in ("trusted_globals", "unpickling") for f in counted[name]
               if f.startswith("~") and not f.startswith("~=")]
    assert len(carried) <= 19, f"{len(carried)} inside functions only hand the allow-list on: {carried}"
    readers = [f for f in counted["trusted_globals"] if not f.startswith("~=")
               and any(part in f for part in ("/load/", "/formats/", "/layout/", "/creators/", "tiers/restore"))]
    assert readers == [], f"these readers take trusted_globals without resolving it into the record: {readers}"


def _tier_factories():
    from supervisor.checkpoint.tiers import manager, peers, sharded
    from supervisor.checkpoint.tiers.local import LocalTier

    return {"tiers.manager.make_manager": manager.make_manager,
            "tiers.peers.make_sharded_manager": peers.make_sharded_manager,
            "ShardedTieredCheckpointManager": sharded.ShardedTieredCheckpointManager.__init__,
            "PeerReplicatedCheckpointManager": peers.PeerReplicatedCheckpointManager.__init__,
            "LocalTier": LocalTier.__init__}


@pytest.mark.parametrize("name", sorted(_tier_factories()))
def test_tier_managers_take_typed_keywords(name):
    """A reader follows ``max_to_keep`` and ``capture`` from the front door (``_manager``,
    ``_sharded_manager``) to the manager that uses them: each is a keyword of its own."""
    parameters = inspect.signature(_tier_factories()[name]).parameters
    untyped = [p.name for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert untyped == [], f"{name} takes **{untyped[0]}: the checkpoint options as an untyped dict"
    assert "capture" in parameters and "trusted_globals" in parameters


def test_one_factory_for_sharded_managers():
    from supervisor.checkpoint.tiers import sharded

    assert not hasattr(sharded, "make_sharded_manager"), "one factory for dcp: tiers.peers.make_sharded_manager"
