"""The loader's allow-list as one frozen record (`Unpickling`, issue 32): resolved once where a
read starts (checked, NumPy's safe globals joined), handed down the load chain as one value, and
what a checkpoint format's ``read`` is given."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch

from supervisor import CheckpointManager, TrainingState
from supervisor.checkpoint.formats.safe_globals import NUMPY_SAFE_GLOBALS, Unpickling
from supervisor.checkpoint.layout import format_registry as formats
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, register_format
from supervisor.checkpoint.load.loader import read_checkpoint

from tests.checkpoint.test_formats import _json_checkpoint, _read_json

pytestmark = pytest.mark.timeout(60)

Point = collections.namedtuple("Point", "x y")


class Holder:
    """A stateful object whose state holds a `Point` (a global beyond torch's allowlist)."""

    def __init__(self, point: Point | None = None) -> None:
        self.point = point

    def state_dict(self) -> dict:
        return {"point": self.point}

    def load_state_dict(self, state: dict) -> None:
        self.point = state["point"]


def test_the_record_is_checked_joined_once_and_frozen():
    record = Unpickling([Point], map_location="meta")
    assert record.trusted_globals == (Point,) and record.map_location == "meta"
    assert record.allowed == (*NUMPY_SAFE_GLOBALS, Point)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.trusted_globals = ()  # type: ignore[misc]
    assert record.at("cpu").allowed == record.allowed and record.at("cpu").map_location == "cpu"
    with pytest.raises(TypeError, match=r"trusted_globals\[1\] must be a class or function.*'Point'"):
        Unpickling([Point, "Point"])
    with pytest.raises(TypeError, match="trusted_globals must be a list of classes or functions"):
        Unpickling("Point")


def test_a_manager_resolves_it_once_and_restores_a_trusted_global_with_it(tmp_path):
    manager = CheckpointManager(str(tmp_path), trusted_globals=[Point], save_mode="sync")
    assert manager.unpickling == Unpickling((Point,)) and manager.trusted_globals == (Point,)
    manager.open()
    try:
        manager.save(1, TrainingState.from_arguments(model=torch.nn.Linear(2, 2), state={"where": Holder(Point(1, 2))}))
        holder = Holder()
        assert manager.restore(TrainingState.from_arguments(model=torch.nn.Linear(2, 2), state={"where": holder}))
        assert holder.point == Point(1, 2)
    finally:
        manager.close()


def test_a_format_reads_with_the_readers_record(tmp_path, monkeypatch):
    formats.formats()
    monkeypatch.setattr(formats, "_FORMATS", dict(formats._FORMATS))
    given = []

    def read(path, manifest, copies, unpickling):
        given.append(unpickling)
        return _read_json(path, manifest, copies, unpickling)

    register_format(CheckpointFormat(name="json", marker="weights.json", description="a JSON weights file",
                                     read=read, single_file=False))
    read_checkpoint(_json_checkpoint(str(tmp_path)), trusted_globals=[Point], map_location="cpu")
    assert given == [Unpickling((Point,), "cpu")]
