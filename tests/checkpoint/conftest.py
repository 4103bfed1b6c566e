"""Shared helpers of the checkpoint tests: a small training state, a fault-injecting opener,
and byte-level snapshots of a logdir."""
from __future__ import annotations

import errno
import hashlib
import os
import re
import threading

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.testing import FakeClock


def small_state(seed: int = 0, width: int = 8) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return TrainingState.from_arguments(model=model, optimizer=optimizer)


def train_step(state: TrainingState, seed: int) -> None:
    """A deterministic optimizer step that changes every parameter in place."""
    model, optimizer = state["model"], state["optimizer"]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, model[0].in_features, generator=g)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def snapshot_tree(directory: str) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``directory`` (the lock files excluded)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            if name.startswith(".supervisor.lock"):
                continue
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


_STEP_IN_PATH = re.compile(r"-(\d+)\.tmp-[0-9a-f]+")


class FaultyOpener:
    """The `CheckpointManager(opener=...)` seam: opens files for real, but for the saves of the
    given steps returns a file whose ``write`` raises ``OSError(code)`` after ``after_bytes``."""

    def __init__(self, code: int = errno.ENOSPC, fail_steps: set[int] | None = None, after_bytes: int = 100,
                 file_name: str = "state.pt") -> None:
        self.code = code
        self.fail_steps = set(fail_steps or ())
        self.fail_all = fail_steps is None
        self.after_bytes = after_bytes
        self.file_name = file_name
        self.failures = 0

    def __call__(self, path: str):
        raw = open(path, "xb", buffering=0)
        match = _STEP_IN_PATH.search(path)
        step = int(match.group(1)) if match else None
        if os.path.basename(path) == self.file_name and (self.fail_all or step in self.fail_steps):
            return _FailingFile(raw, self)
        return raw


class _FailingFile:
    def __init__(self, raw, opener: FaultyOpener) -> None:
        self._raw, self._opener, self._written = raw, opener, 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if self._written + n > self._opener.after_bytes:
            self._opener.failures += 1
            raise OSError(self._opener.code, os.strerror(self._opener.code), self._raw.name)
        self._written += n
        return self._raw.write(data)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()


class GatedOpener:
    """Blocks the first write of ``state.pt`` until ``release`` is set: lets a test change the
    live parameters while a save is provably still being written."""

    def __init__(self) -> None:
        self.writing = threading.Event()
        self.release = threading.Event()

    def __call__(self, path: str):
        raw = open(path, "xb", buffering=0)
        return _GatedFile(raw, self) if path.endswith("state.pt") else raw


class _GatedFile:
    def __init__(self, raw, gate: GatedOpener) -> None:
        self._raw, self._gate = raw, gate

    def write(self, data) -> int:
        self._gate.writing.set()
        assert self._gate.release.wait(10), "test never released the gated write"
        return self._raw.write(data)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start_secs=1_700_000_000.0)


@pytest.fixture
def manager_factory(tmp_path, clock):
    """Makes opened managers on ``tmp_path/logdir`` and closes whatever a test leaves open."""
    made: list[CheckpointManager] = []

    def make(directory=None, **kwargs) -> CheckpointManager:
        kwargs.setdefault("clock", clock)
        manager = CheckpointManager(directory or tmp_path / "logdir", **kwargs)
        manager.open()
        made.append(manager)
        return manager

    yield make
    for manager in made:
        try:
            manager.close(failed=True)
        except Exception:  # noqa: BLE001 - the test already asserted what it wanted
            pass


def restore_into(logdir, state: TrainingState, **kwargs):
    """Restores ``state`` from ``logdir`` as a reader would: a manager that is never opened
    (no lock, no writer), so it works while a writer holds the logdir."""
    kwargs.setdefault("clock", FakeClock())
    return CheckpointManager(logdir, **kwargs).restore(state)
