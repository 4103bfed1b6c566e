"""What a user's own script shows without configuring logging (issue 34 item 5): a restore, a
stop, the periodic progress line, and no routine commit or retention lines; configuring logging
(before or after the session starts) silences the package's own handler, never doubling a line.
Real subprocesses (forked from the zygote, tests/zygote.py): the handler depends on what the whole
process configured."""
from __future__ import annotations

import os

import pytest

from tests import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = """
import logging, sys, torch
{configure}
from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    loss = model(torch.ones(4, 2)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    return {{"loss": loss}}
for last in (150, 300):
    with MonitoredTrainingSession(sys.argv[1], model=model, optimizer=opt, save_checkpoint_steps=50, max_to_keep=2,
                                  log_step_count_steps=100, hooks=[StopAtStepHook(last_step=last)]) as s:
        {late}
        while not s.should_stop():
            s.run(step)
"""


def _run(tmp_path, configure="", late="pass"):
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT.format(configure=configure, late=late))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    result = zygote.python([script, tmp_path / "run"], env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.slow
def test_without_logging_configured_a_user_sees_the_restore_the_stop_and_progress_but_no_commits(tmp_path):
    err = _run(tmp_path)
    lines = err.splitlines()
    assert any("INFO initialised from scratch" in line for line in lines), err
    assert any("INFO restored step=150 from" in line for line in lines), err
    assert any("INFO stopping at step 300" in line for line in lines), err
    assert sum(" steps/sec, loss = " in line for line in lines) >= 2, err  # steps 101 and 201 (and 251)
    assert not any("committed" in line or "retention deleted" in line for line in lines), err
    # (a save that had to wait for the previous one is a WARNING once per cause: issue 34 item 11)
    assert len([line for line in lines if "for the previous save to finish" not in line]) <= 8, err


@pytest.mark.slow
@pytest.mark.parametrize("configure, late", [
    ("logging.basicConfig(level=logging.WARNING)", "pass"),
    ("", "logging.basicConfig(level=logging.WARNING)"),  # configured after the session started
])
def test_an_application_that_configures_logging_sees_only_what_it_asked_for(tmp_path, configure, late):
    err = _run(tmp_path, configure, late)
    assert "restored step=150" not in err and "steps/sec" not in err, err
    assert ("from scratch" in err) == (late != "pass")  # logged before the application configured logging


@pytest.mark.slow
def test_an_application_at_info_sees_each_line_once_in_its_own_format(tmp_path):
    err = _run(tmp_path, 'logging.basicConfig(level=logging.INFO, format="APP %(name)s: %(message)s")')
    restored = [line for line in err.splitlines() if "restored step=150" in line]
    assert len(restored) == 1 and restored[0].startswith("APP supervisor."), err
