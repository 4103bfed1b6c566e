"""State holding NumPy values restores under weights_only loading, every front door takes
``trusted_globals``, and a refusal lists every missing global with its state entry (issue 10)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import supervisor
from supervisor import MonitoredTrainingSession, SingularMonitoredSession, Supervisor
from supervisor.checkpoint.formats.safe_globals import NUMPY_SAFE_GLOBALS, global_name
from supervisor.errors import CheckpointError


class NumpyCounters:
    """A user object whose state_dict holds NumPy scalars and arrays (as many real ones do)."""

    def __init__(self) -> None:
        self.mean, self.count, self.hist, self.flag = np.float64(0.0), np.int64(0), np.zeros(3), np.bool_(False)

    def state_dict(self) -> dict:
        return {"mean": self.mean, "count": self.count, "hist": self.hist, "flag": self.flag,
                "f32": np.float32(1.5), "grid": np.arange(6.0).reshape(2, 3).T, "names": np.array(["a", "bc"])}

    def load_state_dict(self, sd: dict) -> None:
        self.mean, self.count, self.hist, self.flag = sd["mean"], sd["count"], sd["hist"], sd["flag"]
        self.loaded = sd


class Opaque:
    """A benign user class that is not allowlisted."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


class Holder:
    def __init__(self, payload) -> None:
        self.payload = payload

    def state_dict(self) -> dict:
        return {"payload": self.payload}

    def load_state_dict(self, sd: dict) -> None:
        self.payload = sd["payload"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 1)


def _steps(s, n):
    for _ in range(n):
        s.run(lambda: {"loss": torch.tensor(1.0)})


FRONT_DOORS = {
    "Supervisor": lambda logdir, state, **kw: Supervisor(logdir, model=_model(), state=state, **kw).managed_session(),
    "MonitoredTrainingSession": lambda logdir, state, **kw: MonitoredTrainingSession(
        logdir, model=_model(), state=state, **kw),
    "SingularMonitoredSession": lambda logdir, state, **kw: SingularMonitoredSession(
        logdir, model=_model(), state=state, **kw),
}


@pytest.mark.parametrize("door", sorted(FRONT_DOORS))
def test_numpy_scalars_and_arrays_restore_without_trusted_globals(tmp_path, door):
    counters = NumpyCounters()
    counters.mean, counters.count, counters.hist, counters.flag = np.float64(0.25), np.int64(7), np.arange(3.0), np.bool_(True)
    with FRONT_DOORS[door](tmp_path, {"counters": counters}) as s:
        _steps(s, 2)
    restored = NumpyCounters()
    with FRONT_DOORS[door](tmp_path, {"counters": restored}) as s:
        assert s.global_step == 2
    assert type(restored.mean) is np.float64 and restored.mean == 0.25
    assert type(restored.count) is np.int64 and restored.count == 7
    assert type(restored.flag) is np.bool_ and bool(restored.flag)
    np.testing.assert_array_equal(restored.hist, np.arange(3.0))
    np.testing.assert_array_equal(restored.loaded["grid"], np.arange(6.0).reshape(2, 3).T)
    assert restored.loaded["names"].tolist() == ["a", "bc"] and restored.loaded["f32"].dtype == np.float32


@pytest.mark.parametrize("door", sorted(FRONT_DOORS))
def test_every_front_door_accepts_trusted_globals(tmp_path, door):
    # The writer must trust it too: a front door refuses to save what would not load (issue 22.19).
    with FRONT_DOORS[door](tmp_path, {"holder": Holder(Opaque(5))}, trusted_globals=[Opaque]) as s:
        _steps(s, 1)
    with pytest.raises(CheckpointError, match="Opaque"):
        with FRONT_DOORS[door](tmp_path, {"holder": Holder(None)}):
            pass
    holder = Holder(None)
    with FRONT_DOORS[door](tmp_path, {"holder": holder}, trusted_globals=[Opaque]) as s:
        assert s.global_step == 1
    assert isinstance(holder.payload, Opaque) and holder.payload.value == 5


def test_refusal_lists_every_missing_global_with_its_entry(tmp_path):
    # Written by a bare CheckpointManager: a front door refuses to save it (issue 22.19).
    state = supervisor.TrainingState.from_arguments(model=_model(), state={
        "a": Holder(Opaque(1)), "b": Holder([Opaque(2), print]), "c": Holder(np.array([1, "x"], dtype=object))})
    with supervisor.CheckpointManager(tmp_path) as manager:
        manager.save(1, state, wait=True)
    sv = Supervisor(tmp_path, model=_model(), state={"a": Holder(None), "b": Holder(None), "c": Holder(None)})
    with pytest.raises(CheckpointError) as info:
        with sv.managed_session():
            pass
    message = str(info.value)
    assert "needs 3 globals" in message, message
    assert f"{__name__}.Opaque (in state entries 'a', 'b')" in message
    assert "print (in state entry 'b')" in message
    assert "numpy.dtypes.ObjectDType (in state entry 'c')" in message  # object arrays stay closed
    assert f"trusted_globals=[print, numpy.dtypes.ObjectDType, {__name__}.Opaque]" in message


def test_only_specific_numpy_reconstructors_are_allowed():
    names = {global_name(g) for g in NUMPY_SAFE_GLOBALS}
    assert {"numpy._core.multiarray.scalar", "numpy._core.multiarray._reconstruct", "numpy.ndarray",
            "numpy.dtype", "numpy.dtypes.Float64DType"} <= names
    assert "numpy.dtypes.ObjectDType" not in names and "numpy.dtypes.VoidDType" not in names
    assert all(n.startswith("numpy.") for n in names)
    assert not any(n.endswith(("load", "loads", "fromfile", "frompyfunc")) for n in names)


def test_numpy_allowlist_does_not_leak_into_plain_torch_load(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"v": np.float64(1.0)}, path)
    loaded = supervisor.load_checkpoint(path)  # our loader allows NumPy scalars...
    assert loaded["v"] == 1.0
    with pytest.raises(Exception):  # ...without registering them globally for everyone
        torch.load(path, weights_only=True)


class _RawObjectArray:
    """Pickles as an object array built from raw bytes (pointers!) using only NumPy globals."""

    def __reduce__(self):
        from numpy._core.multiarray import _reconstruct

        return (_reconstruct, (np.ndarray, (0,), b"b"), (1, (2,), np.dtype("O"), False, b"\x00" * 16))


def test_numpy_globals_cannot_build_an_object_array_from_raw_bytes(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"entry": _RawObjectArray()}, path)
    with pytest.raises(CheckpointError, match=r"numpy.dtypes.ObjectDType \(in state entry 'entry'\)"):
        supervisor.load_checkpoint(path)
