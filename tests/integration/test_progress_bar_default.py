"""A progress bar on a terminal by default (issue 34 item 5): with stderr a real pseudo-terminal,
tqdm installed and logging not configured, the chief draws a tqdm bar (steps, rate, the latest
loss) instead of the periodic ``step N: ...`` line; piped stderr, ``progress=False`` or configured
logging keep the line. Read back from the terminal and the pipe of real subprocesses."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time

import pytest

from supervisor import MonitoredTrainingSession, Supervisor
from tests import zygote
from tests.killing import trainer_env

_TRAINER = """
import logging, sys, torch
from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession, Supervisor
door, progress, logdir = sys.argv[1], eval(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4:
    logging.basicConfig(level=logging.INFO)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def step():
    loss = model(torch.ones(2, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    return {"loss": loss}
if door == "mts":
    with MonitoredTrainingSession(logdir, model=model, optimizer=opt, log_step_count_steps=10, progress=progress,
                                  hooks=[StopAtStepHook(last_step=60)]) as s:
        while not s.should_stop():
            s.run(step)
else:
    sv = Supervisor(logdir, model=model, optimizer=opt, save_summaries_secs=0.05, progress=progress)
    with sv.managed_session() as s:
        while s.global_step < 60:
            s.run(step)
"""


def _script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAINER)
    return str(script)


def _on_a_terminal(args, timeout=180):
    """Runs ``python *args`` with stderr (and stdin) a pseudo-terminal of 24x100; returns what it
    wrote there (read until it exits; bounded by ``timeout``)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    terminal = os.ttyname(slave)  # the child opens it by name as its stdin and stderr, so this process
    proc = zygote.Forked(args[0], args[1:], output=os.devnull, stdin=terminal, stderr=terminal, env=trainer_env())
    # keeps it open until the child is gone (closed earlier, the terminal could hang up before the child opens it)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every end of the terminal closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, b"".join(chunks).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        os.close(slave)
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def _piped(args):
    done = zygote.python(args, timeout=180, env=trainer_env())
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("door", ["mts", "supervisor"])
def test_a_terminal_shows_a_bar_and_a_pipe_the_periodic_line(tmp_path, door):
    script = _script(tmp_path)
    shown = _on_a_terminal([script, door, "'auto'", str(tmp_path / "tty")])
    assert "60/60" in shown or "train: 60step" in shown, shown  # the bar reached the last step
    assert "step/s" in shown and "loss = " in shown, shown  # the rate and the latest loss
    assert "steps/sec" not in shown, shown  # no periodic INFO line under the bar
    assert "INFO initialised from scratch" in shown  # the other lines still show, above the bar
    piped = _piped([script, door, "'auto'", str(tmp_path / "pipe")])
    assert "steps/sec, loss = " in piped and "step/s" not in piped and "\r" not in piped, piped


@pytest.mark.slow
def test_progress_false_or_configured_logging_keep_the_line_on_a_terminal(tmp_path):
    script = _script(tmp_path)
    for args, where in (([script, "mts", "False", str(tmp_path / "off")], "off"),
                        ([script, "mts", "'auto'", str(tmp_path / "logging"), "basicConfig"], "logging")):
        shown = _on_a_terminal(args)
        assert "step/s" not in shown and "steps/sec, loss = " in shown, (where, shown)
    forced = _piped([script, "mts", "True", str(tmp_path / "forced")])  # True: a bar even into a pipe
    assert "step/s" in forced and "steps/sec" not in forced, forced


@pytest.mark.parametrize("door", [MonitoredTrainingSession, Supervisor])
def test_a_bad_progress_value_is_refused_naming_the_choices(tmp_path, door):
    with pytest.raises(ValueError, match=r"progress must be 'auto'.*True.*False.*got 'yes'"):
        door(str(tmp_path), model=__import__("torch").nn.Linear(1, 1), progress="yes")
