"""Writer failures (SPEC §5.2, §15): ENOSPC / EIO injected through the ``opener`` seam."""
from __future__ import annotations

import errno
import logging
import os

import pytest
import torch

from supervisor import MonitoredSession, TrainingState
from supervisor.checkpoint import CheckpointManager, CheckpointSessionCreator, latest_checkpoint
from supervisor.errors import CheckpointError

from .conftest import FaultyOpener, small_state, snapshot_tree, train_step


def _committed(manager_factory, opener, **kwargs):
    """A manager whose steps 1 and 2 committed before the faults start."""
    state = small_state()
    manager = manager_factory(opener=opener, **kwargs)
    for step in (1, 2):
        train_step(state, step)
        manager.save(step, state, wait=True)
    return manager, state


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
def test_failed_save_removes_its_temp_dir_and_keeps_committed_bytes(manager_factory, tmp_path, code):
    opener = FaultyOpener(code, fail_steps={3})
    manager, state = _committed(manager_factory, opener)
    logdir = tmp_path / "logdir"
    before = snapshot_tree(logdir)

    train_step(state, 3)
    manager.save(3, state)  # async: the failure surfaces at the next call on this thread
    with pytest.raises(CheckpointError) as info:
        manager.wait()

    assert opener.failures == 1
    assert os.strerror(code) in str(info.value) and "step 3" in str(info.value)
    assert str(logdir / "model.ckpt-3") in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code
    assert not [n for n in os.listdir(logdir) if ".tmp-" in n]
    assert snapshot_tree(logdir) == before  # committed checkpoints and index byte-identical
    assert latest_checkpoint(logdir) == str(logdir / "model.ckpt-2")
    assert manager.last_saved_step == 2
    with pytest.raises(CheckpointError, match="step 3"):
        manager.wait()  # every wait() raises it until the next save starts (issue 30 item 6)


def test_sync_save_failure_raises_from_save(manager_factory):
    manager, state = _committed(manager_factory, FaultyOpener(fail_steps={3}), save_mode="sync")
    with pytest.raises(CheckpointError, match="step 3"):
        manager.save(3, state)


def test_close_raises_an_unreported_failure_once(tmp_path, clock):
    manager = CheckpointManager(tmp_path / "logdir", clock=clock, opener=FaultyOpener(fail_steps={1}))
    manager.open()
    manager.save(1, small_state())
    with pytest.raises(CheckpointError, match="step 1"):
        manager.close()
    manager.close()  # idempotent, nothing left to raise


def test_default_policy_stops_the_session_and_close_raises(tmp_path, clock):
    state = small_state()
    manager = CheckpointManager(tmp_path / "logdir", clock=clock, opener=FaultyOpener(fail_steps={2}))
    with pytest.raises(CheckpointError, match="step 2") as info:
        with MonitoredSession(CheckpointSessionCreator(state, manager)) as session:
            for _ in range(5):
                session.run(train_step, state, session.global_step)
                session.save_checkpoint()
                manager._writer.wait()  # let the failure arrive before the next step
                if session.should_stop():
                    break
            assert session.should_stop(), "the failed save must stop the session"
            assert session.global_step == 2
    assert os.strerror(errno.ENOSPC) in str(info.value)
    assert latest_checkpoint(tmp_path / "logdir") == str(tmp_path / "logdir" / "model.ckpt-1")
    assert not manager._lock.held  # released even though the close failed


def test_max_consecutive_save_failures_tolerates_until_k_in_a_row(manager_factory, caplog):
    opener = FaultyOpener(fail_steps={3, 4, 6, 7, 8})
    manager, state = _committed(manager_factory, opener, max_consecutive_save_failures=3)
    with caplog.at_level(logging.WARNING):
        for step in (3, 4, 5, 6, 7):  # 3, 4 fail; 5 commits (resets the count); 6, 7 fail
            train_step(state, step)
            manager.save(step, state, wait=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 4
    assert "2 of max_consecutive_save_failures=3" in warnings[-1]
    assert manager.last_saved_step == 5

    train_step(state, 8)
    with pytest.raises(CheckpointError, match="step 8") as info:
        manager.save(8, state, wait=True)
    assert "3 saves in a row failed" in str(info.value)


def test_tolerated_failure_makes_the_final_save_happen(manager_factory):
    """After a tolerated failure, last_saved_step falls back so the hook's end-of-run save runs."""
    manager, state = _committed(manager_factory, FaultyOpener(fail_steps={3}), max_consecutive_save_failures=2)
    manager.save(3, state, wait=True)
    assert manager.last_saved_step == 2


def test_a_pickling_error_is_a_save_failure_not_a_crash(manager_factory, tmp_path):
    class Unpicklable:
        def state_dict(self):
            return {"lock": _NoPickle()}

        def load_state_dict(self, sd):
            pass

    manager = manager_factory()
    state = TrainingState({"thing": Unpicklable()})
    with pytest.raises(CheckpointError, match="step 1"):
        manager.save(1, state, wait=True)
    assert not [n for n in os.listdir(tmp_path / "logdir") if "model.ckpt" in n]


class _NoPickle:
    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("cannot pickle this")


def test_weights_after_failure_are_unchanged_in_memory(manager_factory):
    manager, state = _committed(manager_factory, FaultyOpener(fail_steps={3}), max_consecutive_save_failures=5)
    weight = state["model"][0].weight.clone()
    manager.save(3, state, wait=True)
    assert torch.equal(state["model"][0].weight, weight)


def test_a_waited_save_reports_its_own_failure_even_after_an_earlier_one(tmp_path, clock):
    reported = []
    manager = CheckpointManager(tmp_path / "logdir", clock=clock, opener=FaultyOpener(fail_steps={1, 2}),
                                on_error=reported.append)
    manager.open()
    state = small_state()
    manager.save(1, state)
    manager.wait()  # delivered to on_error: not raised here
    assert len(reported) == 1 and "step 1" in str(reported[0])
    with pytest.raises(CheckpointError, match="step 2"):
        manager.save(2, state, wait=True)
    with pytest.raises(CheckpointError, match="step 1"):
        manager.close()  # a clean close still surfaces the delivered failure once
