"""The checkpoint benchmark stays runnable and prints every row of its table (its timings are
not asserted here: they belong to ``benchmarks/``, not to a test on a shared machine)."""
from __future__ import annotations

import pytest

from benchmarks.checkpoint import main

ROWS = (
    "stall: async save() blocks the loop",
    "stall: save at a boundary, with a listener",
    "write: save() to commit, MiB/s",
    "  same, retention deleting in the window",
    "restore: verified restore vs torch.load",
    "memory: peak extra RSS, 1st async save",
    "memory: RSS after 50 saves vs 2",
)


@pytest.mark.slow
def test_checkpoint_benchmark_quick(capsys, tmp_path):
    rows = main(["--quick", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    table = out.split("\nfigure", 1)[1]
    for name in ROWS:
        (line,) = [row for row in table.splitlines() if row.startswith(name)]
        assert line.rstrip().endswith(("ok", "MISSES TARGET", "(info)")), line
    assert [r.name for r in rows] == list(ROWS)
    assert all(r.ratio > 0 for r in rows)
    assert "phase breakdown of one save:" in out
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone


@pytest.mark.slow
def test_step_overhead_benchmark_quick(capsys):
    from benchmarks.step_overhead import main as step_overhead

    step_overhead(["--quick"])
    out = capsys.readouterr().out
    for row in ("0 hooks", "5 no-op before_run/after_run hooks", "StopAtStepHook", "bare loop",
                "MonitoredTrainingSession, default hooks", "Supervisor.managed_session(), default services",
                "low-noise"):
        assert row in out, row
