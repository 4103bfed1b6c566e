"""Saves that wait for the previous one are a WARNING, once, with the figures (issue 34 item 11):
two in a row mean saves fall due faster than the storage writes them, and training pauses at
each. A one-off wait (the final save right after a scheduled one) stays INFO.

Each save's write is held by a real opener (the manager's ``opener=`` seam, `GatedOpener`) until
the next save is waiting for it: no timing is guessed.
"""
from __future__ import annotations

import logging
import re

import pytest

from supervisor.checkpoint import CheckpointManager
from tests.checkpoint.conftest import GatedOpener, small_state

pytestmark = pytest.mark.timeout(120)
LOGGER = "supervisor.checkpoint.manager"


def _waiting_saves(manager, opener, steps):
    """Saves each step while the previous save's write is held, releasing it only once this save
    waits for it (the writer's ``wait`` is where a save waits), and holding this save's write again
    as soon as that wait ends (clearing the gate later let a write slip through under load)."""
    wait = manager._writer.wait

    def released_then_wait():
        opener.release.set()
        waited = wait()
        opener.release.clear()  # before this save's own write starts: held until the next save waits
        return waited

    manager._writer.wait = released_then_wait
    state = small_state()
    for step in steps:
        manager.save(step, state)
    opener.release.set()
    manager.wait()


def test_a_save_that_waits_warns_once_with_the_figures(tmp_path, caplog):
    opener = GatedOpener()
    manager = CheckpointManager(str(tmp_path), opener=opener, max_to_keep=None)
    manager.open()
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        _waiting_saves(manager, opener, [1, 2, 3, 4])
    finally:
        manager.close()
    waits = [r for r in caplog.records if r.name == LOGGER and "waited" in r.getMessage()]
    assert [r.levelno for r in waits] == [logging.INFO, logging.WARNING, logging.INFO], waits
    message = waits[1].getMessage()
    figures = re.search(r"step 3 waited (\d+\.\d+) s for the save of step 2 .* (\d+\.\d+) s apart.* took "
                        r"(\d+\.\d+) s", message)
    assert figures, message
    waited, apart, took = map(float, figures.groups())
    # (the held write ends within milliseconds of its release: the wait itself may print as 0.00 s)
    assert waited >= 0 and took >= apart and abs(took - (apart + waited)) < 0.02, message
    assert "less often" in message and "faster storage" in message


def test_a_one_off_wait_warns_nothing(tmp_path, caplog):
    """Save 2 waits for save 1 (as a final save right after a scheduled one); save 3 does not."""
    opener = GatedOpener()
    manager = CheckpointManager(str(tmp_path), opener=opener, max_to_keep=None)
    manager.open()
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        _waiting_saves(manager, opener, [1, 2])
        _waiting_saves(manager, opener, [3])
    finally:
        manager.close()
    waits = [r for r in caplog.records if r.name == LOGGER and "waited" in r.getMessage()]
    assert [r.levelno for r in waits] == [logging.INFO], waits
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
