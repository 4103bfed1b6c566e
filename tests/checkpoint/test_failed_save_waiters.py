"""A failed background save reaches every waiter (issue 30 item 6; Orbax's checkpoint_manager_test
ported): two threads blocked in ``wait()`` while the save fails both get its error, and so does a
later ``wait()`` on the main thread, until the next save starts; that save, the failure already
reported, commits. Real threads, gated by events; a real ENOSPC-like ``OSError`` from the file."""
from __future__ import annotations

import errno
import os
import threading

import pytest

from supervisor.checkpoint import CheckpointManager, latest_checkpoint
from supervisor.errors import CheckpointError

from .conftest import small_state

pytestmark = pytest.mark.timeout(120)
BOUND = 60.0  # every wait below is bounded


class _GatedFailure:
    """The first write of ``state.pt`` of step ``fail_step`` sets ``writing``, waits for
    ``release`` and then fails with ENOSPC; every other file is written for real."""

    def __init__(self, fail_step: int) -> None:
        self.fail_step = fail_step
        self.writing, self.release = threading.Event(), threading.Event()

    def __call__(self, path: str):
        raw = open(path, "xb", buffering=0)
        if os.path.basename(path) == "state.pt" and f"-{self.fail_step}.tmp" in path:
            return _FailingFile(raw, self)
        return raw


class _FailingFile:
    def __init__(self, raw, gate: _GatedFailure) -> None:
        self._raw, self._gate = raw, gate

    def write(self, data) -> int:
        self._gate.writing.set()
        assert self._gate.release.wait(BOUND), "the test never released the save"
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._raw.name)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()


def _wait_in_thread(manager: CheckpointManager, entered: threading.Event, outcomes: dict, key: str) -> threading.Thread:
    def run() -> None:
        entered.set()
        try:
            manager.wait()
            outcomes[key] = None
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test checks
            outcomes[key] = e

    thread = threading.Thread(target=run, name=f"waiter-{key}")
    thread.start()
    return thread


def test_every_waiter_of_a_failed_save_sees_its_error_until_the_next_save(tmp_path, clock):
    gate = _GatedFailure(fail_step=2)
    logdir = tmp_path / "logdir"
    state = small_state()
    with CheckpointManager(logdir, clock=clock, opener=gate, save_mode="async") as manager:
        manager.save(1, state, wait=True)
        manager.save(2, state)  # in the background; blocked in its first write
        assert gate.writing.wait(BOUND)
        outcomes: dict = {}
        entered = {key: threading.Event() for key in ("a", "b")}
        threads = [_wait_in_thread(manager, entered[key], outcomes, key) for key in entered]
        assert all(event.wait(BOUND) for event in entered.values())
        gate.release.set()  # the save fails now, with both waiters in (or entering) wait()
        for thread in threads:
            thread.join(BOUND)
            assert not thread.is_alive()
        assert set(outcomes) == {"a", "b"}
        for key, outcome in outcomes.items():
            assert isinstance(outcome, CheckpointError), (key, outcome)
            assert "step 2" in str(outcome) and "No space left" in str(outcome), outcome
        for _ in range(2):  # a later wait() on the main thread too, as often as it is called
            with pytest.raises(CheckpointError, match="step 2"):
                manager.wait()
        manager.save(3, state, wait=True)  # reported already: the next save clears it and commits
        manager.wait()
    # close() does not raise a failure wait() already raised
    assert latest_checkpoint(logdir) == str(logdir / "model.ckpt-3")


def test_a_failure_no_waiter_saw_is_raised_by_the_next_save_once(tmp_path, clock):
    gate = _GatedFailure(fail_step=2)
    gate.release.set()
    state = small_state()
    with CheckpointManager(tmp_path / "logdir", clock=clock, opener=gate, save_mode="async") as manager:
        manager.save(2, state)
        with pytest.raises(CheckpointError, match="step 2"):
            manager.save(3, state)  # not written: the training thread learns of the failure first
        manager.save(4, state, wait=True)
        manager.wait()
    assert latest_checkpoint(tmp_path / "logdir") == str(tmp_path / "logdir" / "model.ckpt-4")
