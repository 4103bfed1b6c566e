"""benchmarks/distributed.py stays runnable and prints its three rows (timings not asserted:
they belong to the benchmark, not to a test on a shared machine)."""
from __future__ import annotations

import pytest


@pytest.mark.slow
def test_distributed_benchmark_quick(capsys):
    from benchmarks.distributed import LOOPS, main

    times = main(["--quick"])
    out = capsys.readouterr().out
    for loop in LOOPS:
        (row,) = [line for line in out.splitlines() if line.startswith(loop + " ")]
        assert "x (" in row
        assert len(times[loop]) == 3 and all(t > 0 for t in times[loop])
    (agreement,) = [line for line in out.splitlines() if line.startswith("agreement ")]
    assert agreement.rstrip().endswith(("ok (target <= 1.05x)", "MISSES TARGET (<= 1.05x)"))
