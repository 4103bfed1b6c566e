"""`inspect` and `load_variable` on a 1 GiB checkpoint: peak RSS measured, not guessed.

Each command runs in its own child process, started by a small launcher; ``os.wait4`` returns
that child's own peak RSS (``ru_maxrss``). The baseline is a child importing the same modules and doing nothing. A control
child that loads the whole checkpoint (``torch.load`` without mmap) shows the measurement sees a
full load, so the small figures for `inspect` are real.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import zygote
from tests.cli.helpers import ROOT

GIB = 1 << 30
MIB = 1 << 20

WRITE = """
import sys, torch, supervisor
state = {f"layer{i}.weight": torch.full((16 * 1024 * 1024,), float(i)) for i in range(16)}  # 16 x 64 MiB
class Blob:
    def state_dict(self): return state
    def load_state_dict(self, sd): pass
m = supervisor.CheckpointManager(sys.argv[1], save_mode="sync"); m.open()
m.save(1, supervisor.TrainingState({"model": Blob()})); m.close()
"""
BASELINE = "import supervisor.cli, supervisor.checkpoint.load.variables"
LOAD_ONE = ("import sys, supervisor; t = supervisor.load_variable(sys.argv[1], 'model/layer3.weight'); "
            "assert t.numel() == 16 * 1024 * 1024 and t[0].item() == 3.0")
LOAD_ALL = "import sys, torch; d = torch.load(sys.argv[1] + '/state.pt', weights_only=True); print(len(d['model']))"


# A tiny launcher (no torch) runs the command and reports its peak RSS from ``os.wait4``. The
# launcher matters: a child forked straight from this (large) test process would count the
# parent's pages it shared before ``exec`` in its ``ru_maxrss``.
LAUNCHER = """
import json, os, subprocess, sys
with open(sys.argv[1], "wb") as out:
    child = subprocess.Popen(sys.argv[2:], stdout=out)
    _, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss * 1024}))
"""


def peak_rss(args, tmp_path) -> tuple[int, str]:
    """Runs ``python ARGS`` and returns (its peak RSS in bytes, its stdout). Several may run at
    once: each child's ``ru_maxrss`` is its own."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out_path = str(tmp_path / f"child-{threading.get_ident()}.out")
    # fresh interpreters (launcher and child): peak RSS is the point, a fork of the zygote has torch's pages
    launched = subprocess.run([sys.executable, "-c", LAUNCHER, out_path, sys.executable, *args],
                              capture_output=True, text=True, timeout=300, env=env)
    assert launched.returncode == 0, launched.stderr
    report = json.loads(launched.stdout)
    assert report["exit"] == 0, launched.stderr
    with open(out_path, encoding="utf-8") as f:
        return report["maxrss"], f.read()


@pytest.mark.slow
def test_inspect_and_load_variable_peak_rss_on_a_1_gib_checkpoint(tmp_path):
    logdir = str(tmp_path / "run")
    ckpt = os.path.join(logdir, "model.ckpt-1")
    with ThreadPoolExecutor(3) as pool:  # the children's torch imports overlap (2 cores)
        baseline = pool.submit(peak_rss, ["-c", BASELINE], tmp_path)  # needs no checkpoint
        written = zygote.python(["-c", WRITE, logdir], timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
        assert written.returncode == 0, written.stderr
        assert os.path.getsize(os.path.join(ckpt, "state.pt")) >= GIB
        measured = [pool.submit(peak_rss, args, tmp_path) for args in (
            ["-m", "supervisor", "inspect", ckpt, "--json"], ["-c", LOAD_ONE, ckpt], ["-c", LOAD_ALL, ckpt])]
        baseline, _ = baseline.result()
        (inspect_rss, out), (one_rss, _), (full_rss, _) = [f.result() for f in measured]
    print(f"\npeak RSS: baseline {baseline / MIB:.0f} MiB, inspect {inspect_rss / MIB:.0f} MiB, "
          f"load_variable(64 MiB entry) {one_rss / MIB:.0f} MiB, full torch.load {full_rss / MIB:.0f} MiB")

    report = json.loads(out)
    assert report["bytes"] >= GIB and len(report["variables"]) >= 16
    assert full_rss - baseline > 0.9 * GIB              # the measurement sees a full load
    assert inspect_rss - baseline < 64 * MIB            # inspect reads no tensor data
    # One 64 MiB entry: its mapped pages plus the returned copy (measured ~121 MiB), not 1 GiB.
    assert one_rss - baseline < 2 * 64 * MIB + 32 * MIB
