"""A forged checkpoint that reduces to a global no checkpoint legitimately holds (issue 30 item 5):
refused, no code run, and the refusal says the file may be malicious instead of advising
``trusted_globals=[posix.system]``. A benign user class keeps its opt-in advice."""
from __future__ import annotations

import builtins
import importlib
import os
import shutil
import socket
import subprocess

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager, check_loadable, load_checkpoint
from supervisor.errors import CheckpointError

from .test_security import TrustedThing, _plant_checkpoint

pytestmark = pytest.mark.timeout(60)


class _Reduces:
    """Unpickling this calls ``function(*args)``."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return (self.function, self.args)


def _forged(marker: str) -> dict:
    return {"os.system": _Reduces(os.system, f"touch {marker}"), "subprocess.Popen": _Reduces(subprocess.Popen, ["true"]),
            "os.execv": _Reduces(os.execv, "/bin/true", ["true"]), "exec": _Reduces(builtins.exec, "1"),
            "eval": _Reduces(builtins.eval, "1"), "compile": _Reduces(builtins.compile, "1", "x", "eval"),
            "getattr": _Reduces(builtins.getattr, [], "append"), "__import__": _Reduces(builtins.__import__, "os"),
            "open": _Reduces(builtins.open, marker, "w"), "importlib": _Reduces(importlib.import_module, "os"),
            "socket": _Reduces(socket.create_connection, ("127.0.0.1", 9)),
            "shutil": _Reduces(shutil.rmtree, marker), "pty": _Reduces(__import__("pty").spawn, "true")}


NAMES = list(_forged("x"))


@pytest.mark.parametrize("name", NAMES)
def test_a_global_no_checkpoint_holds_is_called_malicious_never_trusted(tmp_path, clock, name):
    marker = tmp_path / "pwned"
    logdir = tmp_path / "logdir"
    path = _plant_checkpoint(logdir, 5, {"global_step": 5, "model": _forged(str(marker))[name]})
    for attempt in (lambda: load_checkpoint(path), lambda: _restore(logdir, clock)):
        with pytest.raises(CheckpointError) as info:
            attempt()
        message = str(info.value)
        assert "model.ckpt-5" in message and "may be malicious" in message, message
        assert "trusted_globals=[" not in message and "If you trust" not in message, message
        assert "do not add" in message.lower(), message
    assert not marker.exists()


def _restore(logdir, clock):
    with CheckpointManager(logdir, clock=clock) as manager:
        manager.restore(TrainingState.from_arguments(model=torch.nn.Linear(2, 2)))


def test_a_benign_user_class_keeps_the_opt_in_advice(tmp_path):
    path = _plant_checkpoint(tmp_path / "logdir", 1, {"global_step": 1, "extra": TrustedThing(7)})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "trusted_globals=[" in str(info.value) and "TrustedThing" in str(info.value)
    assert "malicious" not in str(info.value)


def test_a_mix_names_the_dangerous_global_and_suggests_trusting_nothing(tmp_path):
    path = _plant_checkpoint(tmp_path / "logdir", 1, {"global_step": 1, "extra": TrustedThing(7),
                                                       "model": _Reduces(os.system, "true")})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "system" in str(info.value) and "may be malicious" in str(info.value)
    assert "trusted_globals=[" not in str(info.value)


class _HoldsASystemCall:
    def state_dict(self):
        return {"call": _Reduces(os.system, "true")}

    def load_state_dict(self, state):
        pass


def test_a_state_holding_such_a_global_is_refused_at_the_boundary_without_suggesting_trust():
    state = TrainingState.from_arguments(model=torch.nn.Linear(2, 2), state={"thing": _HoldsASystemCall()})
    with pytest.raises(CheckpointError) as info:
        check_loadable(state.state_dict(), (), "model.ckpt-1", 1)
    message = str(info.value)
    assert "posix.system" in message and "in state entry 'thing'" in message, message
    assert "trusted_globals=[" not in message and "may be malicious" not in message, message


@pytest.mark.parametrize("name, dangerous", [
    ("posix.system", True), ("nt.system", True), ("commands.Popen", True), ("__builtin__.eval", True),
    ("exec", True), ("io.open", True), ("os.path.join", True), ("torch.hub.load", True), ("code.interact", True),
    ("code.models.Net", False), ("profile.settings.Config", False), ("collections.OrderedDict", False),
    ("builtins.set", False), ("mypackage.model.Config", False),
])
def test_what_counts_as_a_global_no_checkpoint_holds(name, dangerous):
    from supervisor.checkpoint.formats.dangerous_globals import is_dangerous

    assert is_dangerous(name) is dangerous
