"""Issue 9 finding 2 with real signals to real processes: a stop request ends every wait the
runtime owns, a planted FIFO never blocks a restore, and a second SIGTERM interrupts a hook that
hangs while the session closes (after a WARNING that names it). Every child is bounded."""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest

from tests import forked_io, zygote

ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
PRELUDE = "import logging, sys\nlogging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(levelname)s %(message)s')\n"


class Child:
    """A Python child (``python -u``, forked from the zygote: tests/zygote.py) whose combined
    output is read from its file, so every wait is bounded; killed if it outlives a test."""

    def __init__(self, script: str, directory: str) -> None:
        path = forked_io.new_file(directory, "child")
        with open(path, "w") as f:
            f.write(PRELUDE + textwrap.dedent(script))
        self.proc = zygote.Forked(path, [], output=path + ".out", env=forked_io.unbuffered(ENV))

    @property
    def output(self) -> str:
        return forked_io.output(self.proc)

    def wait_for(self, text: str, timeout_secs: float) -> None:
        forked_io.wait_for(self.proc, text, timeout_secs)

    def finish(self, timeout_secs: float) -> tuple[int, str]:
        try:
            self.proc.wait(timeout_secs)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout_secs} s:\n{self.output}") from None
        return self.proc.returncode, self.output

    def kill(self) -> None:
        forked_io.finish(self.proc, timeout=30)


@pytest.fixture
def children(tmp_path_factory):
    made: list[Child] = []
    directory = str(tmp_path_factory.mktemp("children"))  # not the test's tmp_path: a logdir
    yield lambda script: made.append(Child(script, directory)) or made[-1]
    for child in made:
        child.kill()


@pytest.mark.slow
def test_sigterm_ends_a_workers_wait_for_the_chief(tmp_path, children):
    child = children(f"""
        import torch
        from supervisor import MonitoredSession, TrainingState
        from supervisor.checkpoint import WorkerSessionCreator
        from supervisor.errors import StopRequestedError
        creator = WorkerSessionCreator(TrainingState({{"model": torch.nn.Linear(2, 2)}}), {str(tmp_path)!r},
                                       max_wait_secs=7200, recovery_wait_secs=30)
        try:
            MonitoredSession(creator, handle_signals=True)
        except StopRequestedError as e:
            print("STOPPED:", e)
    """)
    child.wait_for("waiting for the chief's checkpoint", 120)
    start = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    code, out = child.finish(timeout_secs=20)
    assert code == 0 and "STOPPED: stopped (a stop signal (SIGTERM/SIGINT)) after waiting" in out, out
    assert time.monotonic() - start < 20


@pytest.mark.slow
def test_restore_never_blocks_on_a_planted_fifo(tmp_path, children):
    child = children(f"""
        import os, torch
        from supervisor import TrainingState
        from supervisor.checkpoint import CheckpointManager
        state = TrainingState({{"model": torch.nn.Linear(2, 2)}})
        with CheckpointManager({str(tmp_path)!r}) as manager:
            manager.save(1, state, wait=True)
            manager.save(2, state, wait=True)
        for name in ("state.pt", "MANIFEST.json"):
            os.remove(os.path.join({str(tmp_path)!r}, "model.ckpt-2", name))
            os.mkfifo(os.path.join({str(tmp_path)!r}, "model.ckpt-2", name))
        print("PLANTED", flush=True)
        with CheckpointManager({str(tmp_path)!r}) as manager:
            print("RESTORED", manager.restore(state).global_step)
    """)
    child.wait_for("PLANTED", 120)
    code, out = child.finish(timeout_secs=30)  # the old code blocked in open() for good
    assert code == 0 and "RESTORED 1" in out, out
    assert "not a regular file (a FIFO)" in out, out


@pytest.mark.slow
def test_second_sigterm_interrupts_a_hook_hanging_in_end(tmp_path, children):
    child = children("""
        import time
        from supervisor import Hook, MonitoredSession

        class HangsInEnd(Hook):
            def end(self, session):
                print("END STARTED", flush=True)
                while True:
                    time.sleep(0.05)

        with MonitoredSession(hooks=[HangsInEnd()], handle_signals=True, stop_grace_secs=1) as s:
            print("TRAINING", flush=True)
            while not s.should_stop():
                s.run(time.sleep, 0.01)
    """)
    child.wait_for("TRAINING", 120)
    child.proc.send_signal(signal.SIGTERM)
    child.wait_for("END STARTED", 30)
    child.wait_for("HangsInEnd.end() is still running 1 s (stop_grace_secs)", 30)
    child.proc.send_signal(signal.SIGTERM)
    code, out = child.finish(timeout_secs=20)
    assert code != 0 and "KeyboardInterrupt: second stop signal (SIGTERM after SIGTERM)" in out, out
