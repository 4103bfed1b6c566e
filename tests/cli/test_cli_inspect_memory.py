"""`inspect` and `load_variable` on a 1 GiB checkpoint: peak RSS measured, not guessed.

Each command runs in its own child process; ``os.wait4`` returns that child's own peak RSS
(``ru_maxrss``). The baseline is a child importing the same modules and doing nothing. A control
child that loads the whole checkpoint (``torch.load`` without mmap) shows the measurement sees a
full load, so the small figures for `inspect` are real.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

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
BASELINE = "import supervisor.cli, supervisor.checkpoint.reader"
LOAD_ONE = ("import sys, supervisor; t = supervisor.load_variable(sys.argv[1], 'model/layer3.weight'); "
            "assert t.numel() == 16 * 1024 * 1024 and t[0].item() == 3.0")
LOAD_ALL = "import sys, torch; d = torch.load(sys.argv[1] + '/state.pt', weights_only=True); print(len(d['model']))"


def peak_rss(args) -> tuple[int, str]:
    """Runs ``python ARGS`` and returns (its peak RSS in bytes, its stdout)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, *args], stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)  # reaps the child and returns its own rusage
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        assert child.returncode == 0, err.read().decode()
        return usage.ru_maxrss * 1024, out.read().decode()


@pytest.mark.slow
def test_inspect_and_load_variable_peak_rss_on_a_1_gib_checkpoint(tmp_path):
    logdir = str(tmp_path)
    subprocess.run([sys.executable, "-c", WRITE, logdir], check=True, timeout=300,
                   env=dict(os.environ, PYTHONPATH=ROOT))
    ckpt = os.path.join(logdir, "model.ckpt-1")
    assert os.path.getsize(os.path.join(ckpt, "state.pt")) >= GIB

    baseline, _ = peak_rss(["-c", BASELINE])
    inspect_rss, out = peak_rss(["-m", "supervisor", "inspect", ckpt, "--json"])
    one_rss, _ = peak_rss(["-c", LOAD_ONE, ckpt])
    full_rss, _ = peak_rss(["-c", LOAD_ALL, ckpt])
    print(f"\npeak RSS: baseline {baseline / MIB:.0f} MiB, inspect {inspect_rss / MIB:.0f} MiB, "
          f"load_variable(64 MiB entry) {one_rss / MIB:.0f} MiB, full torch.load {full_rss / MIB:.0f} MiB")

    report = json.loads(out)
    assert report["bytes"] >= GIB and len(report["variables"]) >= 16
    assert full_rss - baseline > 0.9 * GIB              # the measurement sees a full load
    assert inspect_rss - baseline < 64 * MIB            # inspect reads no tensor data
    # One 64 MiB entry: its mapped pages plus the returned copy (measured ~121 MiB), not 1 GiB.
    assert one_rss - baseline < 2 * 64 * MIB + 32 * MIB
