"""A discarded overlapped save says who settled its copy, on which thread and when (SPEC §5.9):
what a report of an unexpected discard needs to tell a real write from a race."""
from __future__ import annotations

import logging
import threading

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.save.overlap import ThreadCopier

pytestmark = pytest.mark.timeout(60)


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return TrainingState.from_arguments(model=model, optimizer=optimizer)


def test_a_discarded_save_names_who_settled_the_copy_on_which_thread(tmp_path, caplog):
    gate = threading.Event()

    def held_copy(dst, src):
        assert gate.wait(30), "the test never opened the gate"
        torch._foreach_copy_(dst, src)

    state = _state()
    model, optimizer = state["model"], state["optimizer"]
    with CheckpointManager(tmp_path, capture="overlapped", copier=ThreadCopier(held_copy)) as manager:
        manager.save(1, state)
        model.weight.data.mul_(2)  # a write outside optimizer.step() while the copy is held
        gate.set()
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(3, 4)).sum().backward()
        with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
            optimizer.step()  # its pre-hook settles the copy, on this thread
            manager.wait()
    messages = [r.getMessage() for r in caplog.records]
    assert any("discarding the checkpoint of step 1" in m and "weight" in m for m in messages), messages
    [how] = [m for m in messages if "was settled by" in m]
    assert "an optimizer step() / load_state_dict() pre-hook" in how, how
    assert f"thread {threading.current_thread().name!r}" in how and "s after the boundary" in how, how


def test_a_save_that_commits_logs_no_settle_diagnostic(tmp_path, caplog):
    state = _state()
    optimizer = state["optimizer"]
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        with CheckpointManager(tmp_path, capture="overlapped", copier=ThreadCopier()) as manager:
            manager.save(1, state)
            optimizer.zero_grad(set_to_none=True)
            state["model"](torch.randn(3, 4)).sum().backward()
            optimizer.step()
            manager.wait()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    assert (tmp_path / "model.ckpt-1").is_dir()
