"""benchmarks/evaluator.py stays runnable and prints its figures; the bytes figure is
deterministic, so it is asserted (timings are not: shared machine)."""
from __future__ import annotations

import pytest

from benchmarks.evaluator import main


@pytest.mark.slow
def test_evaluator_benchmark_quick(capsys):
    figures = main(["--quick"])
    out = capsys.readouterr().out
    assert "one read" in out and "verify, then load" in out and "commit -> evaluation start" in out
    assert figures["one_read_rchar"] == pytest.approx(1.0, abs=0.01)  # every byte read once
    assert figures["verify_then_load_rchar"] > 1.9  # the path it replaces read it 2-3 times
    assert figures["latency_median_poll_0.05"] < 5.0
