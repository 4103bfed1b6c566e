"""Never unpickle unsafely (SPEC §5.4, §15): a malicious state.pt is refused and runs no code."""
from __future__ import annotations

import os

import pytest
import torch

from supervisor import MonitoredSession
from supervisor.checkpoint import CheckpointManager, CheckpointSessionCreator, load_checkpoint
from supervisor.checkpoint.storage.fileio import checksum_file
from supervisor.checkpoint.layout.format import FileRecord, Manifest
from supervisor.errors import CheckpointError

from .conftest import small_state


class _Payload:
    """Unpickling this runs ``exec``, which creates ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


class TrustedThing:
    """A benign user class a checkpoint may legitimately contain."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


def _plant_checkpoint(logdir, step: int, payload) -> str:
    """Writes a committed-looking checkpoint (valid manifest and checksum) holding ``payload``."""
    path = logdir / f"model.ckpt-{step}"
    path.mkdir(parents=True)
    torch.save(payload, path / "state.pt")
    size, checksum = checksum_file(str(path / "state.pt"))
    manifest = Manifest(step=step, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                        files={"state.pt": FileRecord(size, checksum)})
    (path / "MANIFEST.json").write_text(manifest.to_json())
    (logdir / "checkpoint").write_text(f'model_checkpoint_path: "model.ckpt-{step}"\n')
    return str(path)


def test_malicious_pickle_is_refused_and_runs_no_code(tmp_path, clock):
    marker = tmp_path / "pwned"
    logdir = tmp_path / "logdir"
    _plant_checkpoint(logdir, 5, {"global_step": 5, "model": _Payload(str(marker))})

    with CheckpointManager(logdir, clock=clock) as manager:
        with pytest.raises(CheckpointError) as info:
            manager.restore(small_state())
    assert "needs the global exec" in str(info.value) and "trusted_globals" in str(info.value)
    assert "model.ckpt-5" in str(info.value)
    with pytest.raises(CheckpointError, match="needs the global exec"):
        load_checkpoint(logdir / "model.ckpt-5")
    assert not marker.exists()


def test_malicious_checkpoint_stops_session_creation(tmp_path, clock):
    marker = tmp_path / "pwned"
    logdir = tmp_path / "logdir"
    _plant_checkpoint(logdir, 5, {"global_step": 5, "model": _Payload(str(marker))})
    init_calls = []
    manager = CheckpointManager(logdir, clock=clock)
    with pytest.raises(CheckpointError, match="needs the global exec"):
        MonitoredSession(CheckpointSessionCreator(small_state(), manager, init_fn=init_calls.append))
    assert not marker.exists()
    assert init_calls == []  # never silently starts fresh instead
    assert not manager._lock.held


def test_trusted_globals_allow_exactly_the_named_class(tmp_path):
    logdir = tmp_path / "logdir"
    path = _plant_checkpoint(logdir, 1, {"global_step": 1, "extra": TrustedThing(7)})
    with pytest.raises(CheckpointError, match="TrustedThing"):
        load_checkpoint(path)
    loaded = load_checkpoint(path, trusted_globals=[TrustedThing])
    assert isinstance(loaded["extra"], TrustedThing) and loaded["extra"].value == 7


def test_rng_and_optimizer_state_need_no_trusted_globals(manager_factory):
    manager = manager_factory()
    path = manager.save(1, small_state(), wait=True)
    torch.load(os.path.join(path, "state.pt"), weights_only=True)  # raises if anything is pickled


def test_trusted_globals_are_validated():
    with pytest.raises(TypeError, match="trusted_globals"):
        CheckpointManager("x", trusted_globals="mymodule.MyClass")
    with pytest.raises(TypeError, match=r"trusted_globals\[0\]"):
        CheckpointManager("x", trusted_globals=["mymodule.MyClass"])
