"""No reader of checkpoint files blocks on a FIFO (issue 21 item 4): a FIFO as ``state.pt``,
``MANIFEST.json`` or ``.supervisor.finished`` is reported as "not a regular file" at once.

Files are opened by `supervisor.checkpoint.storage.fileio.open_regular` (``O_NONBLOCK``, ``fstat``, refuse
anything but a regular file, then blocking again). Each case runs in a subprocess with a timeout,
so a regression fails the test instead of hanging the suite; one sends SIGTERM to the evaluator
CLI while it reads and checks it exits.
"""
from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time

import pytest

from supervisor.checkpoint.storage.fileio import NotARegularFileError, open_regular
from tests import forked_io, zygote
from tests.cli.helpers import ROOT, make_logdir

pytestmark = pytest.mark.timeout(180)


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return zygote.python(["-c", textwrap.dedent(code)], timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"blocked for {timeout} s (on a FIFO?): {e.stdout!r} {e.stderr!r}")


def fifo_instead_of(path) -> None:
    os.remove(path)
    os.mkfifo(path)


def test_open_regular_refuses_a_fifo_a_directory_and_a_device_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path, kind in [(tmp_path / "fifo", "a FIFO"), (tmp_path, "a directory"), ("/dev/null", "a character device")]:
        with pytest.raises(NotARegularFileError, match=f"not a regular file \\({kind}\\)") as info:
            open_regular(str(path))
        assert str(path) in str(info.value) and isinstance(info.value, OSError)
    (tmp_path / "f").write_bytes(b"abc")
    fd = open_regular(str(tmp_path / "f"))
    try:
        import fcntl

        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK  # blocking again for the reader
        assert os.read(fd, 10) == b"abc"
    finally:
        os.close(fd)


def test_a_fifo_state_pt_is_damaged_for_every_evaluation_entry_point(tmp_path):
    make_logdir(tmp_path, steps=(100,))
    fifo_instead_of(tmp_path / "model.ckpt-100" / "state.pt")
    done = run_python(f"""
        import torch
        from supervisor.checkpoint.load.loader import read_checkpoint
        from supervisor.errors import CheckpointCorruptError
        from supervisor.estimator import Estimator
        from supervisor.estimator.sidecar import SidecarEvaluator

        path = {str(tmp_path / "model.ckpt-100")!r}
        try:
            read_checkpoint(path)
        except CheckpointCorruptError as e:
            print("read_checkpoint:", e)
        def model():
            return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        step = lambda m, batch: {{"m": float(m(batch).sum())}}
        evaluator = SidecarEvaluator(model(), [torch.zeros(1, 64)], {str(tmp_path)!r}, eval_step=step, timeout=0.5)
        evaluator.start()
        print("sidecar corrupt:", evaluator.stats.corrupt)
        estimator = Estimator({str(tmp_path)!r}, model=model(), train_step=lambda b: {{"loss": 0.0}}, eval_step=step)
        try:
            estimator.evaluate(lambda: [torch.zeros(1, 64)], steps=1)
        except CheckpointCorruptError as e:
            print("Estimator.evaluate:", e)
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("read_checkpoint:") and "state.pt is not a regular file (a FIFO)" in line
               for line in lines), done.stdout
    assert "sidecar corrupt: 1" in lines, done.stdout
    assert any(line.startswith("Estimator.evaluate:") and "not a regular file" in line for line in lines), done.stdout


def test_a_fifo_manifest_does_not_block_inspect(tmp_path):
    make_logdir(tmp_path, steps=(100, 200))
    os.remove(tmp_path / "checkpoint")  # no index: inspect looks at every directory's manifest
    fifo_instead_of(tmp_path / "model.ckpt-200" / "MANIFEST.json")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        done = zygote.run(["inspect", tmp_path], timeout=60, env=env)  # a real process (tests/zygote.py)
    except subprocess.TimeoutExpired:
        pytest.fail("inspect LOGDIR blocked on a FIFO MANIFEST.json")
    assert done.returncode == 0, done.stderr
    assert "model.ckpt-100" in done.stdout


def test_a_fifo_finished_mark_does_not_block_the_evaluator(tmp_path):
    os.mkfifo(tmp_path / ".supervisor.finished")
    done = run_python(f"""
        import logging
        logging.basicConfig(level=logging.WARNING)
        from supervisor.checkpoint.layout.finished import read_finished
        print("mark:", read_finished({str(tmp_path)!r}))
    """)
    assert done.returncode == 0, done.stderr
    assert "mark: FinishedMark(" in done.stdout  # exists: the run counts as finished, with a WARNING
    assert "not a regular file (a FIFO)" in done.stderr


def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc to see the signal handler")
def test_sigterm_stops_the_evaluator_cli_on_a_logdir_with_a_fifo_state_pt(tmp_path):
    logdir = tmp_path / "run"
    make_logdir(logdir, steps=(100,))
    fifo_instead_of(logdir / "model.ckpt-100" / "state.pt")
    (tmp_path / "factory.py").write_text(textwrap.dedent("""
        import torch
        def model():
            return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        def data():
            return [torch.zeros(1, 64)]
        def step(m, batch):
            return {"m": float(m(batch).sum())}
    """))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    factory = str(tmp_path / "factory.py")
    err = str(tmp_path / "evaluate.err")
    process = zygote.Forked(None, ["evaluate", logdir, "--model", f"{factory}:model", "--data", f"{factory}:data",
                                   "--eval-step", f"{factory}:step", "--poll-secs", "0.2"], module="supervisor",
                            output=str(tmp_path / "evaluate.out"), stderr=err, env=env)
    try:
        deadline = time.monotonic() + 90
        while not _catches_sigterm(process.pid):  # the evaluator is running: it reads the checkpoint now
            assert process.poll() is None and time.monotonic() < deadline, (forked_io.output(process),
                                                                             forked_io.output(process, err))
            time.sleep(0.05)
        # It met the FIFO and went on (the bug: blocked opening it, this line never came): now stop it.
        forked_io.wait_for(process, "skipping checkpoint", timeout=90, path=err)
        process.send_signal(signal.SIGTERM)
        try:
            out = forked_io.communicate(process, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the evaluator did not stop at SIGTERM (blocked opening a FIFO state.pt)")
    finally:
        forked_io.finish(process)
    assert process.returncode == 0, forked_io.output(process, err)
    assert "1 damaged" in out, out
