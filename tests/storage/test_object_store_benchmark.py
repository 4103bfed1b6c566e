"""``benchmarks/object_store.py`` stays runnable against its own loopback S3 server and prints
every figure and every ratio row (its timings are not asserted: they belong to ``benchmarks/``,
not to a test on a shared machine); its server never outlives it."""
from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import time

import pytest

from supervisor.checkpoint import CheckpointManager, read_checkpoint

from tests import forked_io, zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "benchmarks", "object_store.py")
OURS = ("ours: save to commit", "ours: verified restore")
THEIRS = ("DCP save (FsspecWriter, 1 thread)", "DCP save (FsspecWriter, 8 threads)", "torch.save + fs.pipe",
          "DCP load (FsspecReader, 1-thread save)", "DCP load (FsspecReader, 8-thread save)",
          "fs.cat_file + torch.load")
RATIOS = {"ours/DCP(1): save to commit": "target", "ours/DCP(8): save to commit": "target",
          "ours/DCP(1): verified restore": "target", "ours/DCP(8): verified restore": "target",
          "ours/torch.save+upload: save": "info", "ours/download+torch.load: restore": "info"}
TIMED = re.compile(r"\d+\.\d{3} \(\d+\.\d{3}-\d+\.\d{3}\) s +\d+\.\d MB/s$")


@pytest.fixture(autouse=True)
def _needs_the_extra() -> None:
    for module in ("s3fs", "moto"):
        pytest.importorskip(module, reason='the object-store benchmark needs the test extra: pip install -e ".[test]"')


def _run(script: str, args: list[str], timeout_secs: float, directory: str) -> subprocess.CompletedProcess:
    """Runs ``python SCRIPT ARGS`` (forked from the zygote, tests/zygote.py) in its own process
    group, killed whole (server included) on a timeout; its output goes to files in ``directory``.

    Without the ``AWS_*`` variables (the suite's server fixture sets them for the session): the
    benchmark reaches its server through ``storage_options`` alone, so every client it drives
    (ours for save and for restore, DCP's, s3fs's) must use them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    stderr = os.path.join(directory, "benchmark.err")
    process = zygote.Forked(script, args, cwd=ROOT, env=env, output=os.path.join(directory, "benchmark.out"),
                            stderr=stderr, new_session=True)
    try:
        process.wait(timeout=timeout_secs)
    except subprocess.TimeoutExpired:
        process.kill_group()
        process.wait(60)
        pytest.fail(f"{args} did not finish in {timeout_secs} s:\n{forked_io.output(process)[-3000:]}\n"
                    f"{forked_io.output(process, stderr)[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, forked_io.output(process),
                                       forked_io.output(process, stderr))


def _line(out: str, start: str) -> str:
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith(start)]
    assert len(lines) == 1, (start, out)
    return lines[0][len(start):].strip()


@pytest.mark.slow
def test_smoke_run_prints_every_figure_and_ratio(tmp_path):
    done = _run(BENCHMARK, ["--sizes", "smoke", "--rounds", "1"], timeout_secs=240, directory=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "smoke (8 MiB) model + Adam" in out and "moto S3 server on http://127.0.0.1:" in out
    for figure in THEIRS:
        assert TIMED.search(_line(out, figure)), (figure, out)
    # Until the engine writes and reads s3:// logdirs (storage_options=), ours says why it did
    # not run and every other row still prints; from then on its figures are timed like the others.
    available = {OURS[0]: "storage_options" in inspect.signature(CheckpointManager).parameters}
    available[OURS[1]] = available[OURS[0]] and "storage_options" in inspect.signature(read_checkpoint).parameters
    for figure in OURS:
        shown = _line(out, figure)
        assert TIMED.search(shown) if available[figure] else shown.startswith("ours: not available ("), (figure, out)
    table = out.split("\nratio of medians", 1)[1]
    for row, kind in RATIOS.items():
        verdict = _line(table, f"{row} @ smoke (8 MiB)")
        if not available[OURS[1] if row.endswith("restore") else OURS[0]]:
            assert verdict.startswith("n/a (ours: not available ("), (row, verdict)
        elif kind == "target":
            assert re.fullmatch(r"\d+\.\d{3}x  target <= 1x  (ok|MISSES TARGET)", verdict), (row, verdict)
        else:
            assert re.fullmatch(r"\d+\.\d{3}x  \(info\)", verdict), (row, verdict)


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "64X"], "--sizes: '64X' is not NM, NG (at least 1M) or smoke; e.g. --sizes 64M,1G"),
    (["--sizes", "512K"], "--sizes: '512K' is not NM, NG (at least 1M) or smoke"),
    (["--sizes", ","], "--sizes: ',' names no size; e.g. --sizes 64M,1G or --sizes smoke"),
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--dcp-thread-counts", "1,0"],
     "--dcp-thread-counts: '1,0' is not a list of distinct positive integers; e.g. 1,8"),
])
def test_bad_arguments_are_refused_before_any_server_starts(argv, message, capsys, monkeypatch):
    from benchmarks import object_store

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError("a server was started for bad arguments")

    monkeypatch.setattr(object_store, "S3Server", no_server)
    with pytest.raises(SystemExit) as exit_info:
        object_store.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """A benchmark killed by a timeout (SIGKILL: no ``finally`` runs) leaves no server behind."""
    starter = tmp_path / "starter.py"  # forked from the zygote (tests/zygote.py)
    starter.write_text("import sys, time; sys.path.insert(0, sys.argv[1]); from benchmarks._s3_server import S3Server; "
                       "s = S3Server().start(); print(s.process.pid, flush=True); time.sleep(120)")
    process = zygote.Forked(str(starter), [ROOT], output=str(tmp_path / "starter.out"))
    try:
        server_pid = int(forked_io.wait_for(process, "\n", timeout=120))  # the server answers by now
        assert _alive(server_pid)
    finally:
        process.kill()
        process.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _alive(server_pid):
            return
        time.sleep(0.1)
    os.kill(server_pid, signal.SIGKILL)
    pytest.fail(f"the S3 server (pid {server_pid}) outlived the process that started it by 10 s")
