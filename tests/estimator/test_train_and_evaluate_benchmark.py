"""benchmarks/eval_listener_stall.py stays runnable and prints its three rows (timings belong to
the benchmark, not to a test on a shared machine)."""
from __future__ import annotations

import pytest

from benchmarks.eval_listener_stall import VARIANTS, main


@pytest.mark.slow
def test_eval_listener_stall_benchmark_quick(capsys):
    stalls = main(["--quick"])
    out = capsys.readouterr().out
    assert set(stalls) == set(VARIANTS) and all(len(v) == 2 for v in stalls.values())
    for variant in VARIANTS:
        assert any(line.strip().startswith(variant) and line.rstrip().endswith("x no listener")
                   for line in out.splitlines()), out
