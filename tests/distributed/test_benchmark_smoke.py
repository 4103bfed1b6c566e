"""benchmarks/distributed.py stays runnable and prints every loop's rows (timings not asserted:
they belong to the benchmark, not to a test on a shared machine)."""
from __future__ import annotations

import re
import shutil

import pytest


@pytest.mark.slow
def test_distributed_benchmark_quick(capsys):
    from benchmarks.distributed import LOOPS, main

    times = main(["--quick"])
    out = capsys.readouterr().out
    for loop in LOOPS:
        rows = [line for line in out.splitlines() if line.startswith(loop + " ")]
        assert len(rows) == 2 and all("x (" in row for row in rows), rows  # whole round, typical step
        assert len(times[loop]) == 3  # one (mean step, median step, every step) per round
        for mean_us, median_us, steps in times[loop]:
            assert mean_us > 0 and median_us > 0 and len(steps) == 50
    for agreement in [line for line in out.splitlines() if line.startswith("agreement ")]:
        assert ("ok (target <= 1.05x)" in agreement) != ("MISSES TARGET (<= 1.05x)" in agreement)
        assert "over py_hook" in agreement
    assert "all steps pooled" in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recovery_benchmark_kill_quick(capsys):
    """benchmarks/recovery.py: a SIGKILLed rank under torchrun --max-restarts=1 — the job
    recovers by itself, every phase of the breakdown is printed, and the second attempt restores
    the last checkpoint committed before the kill (times not asserted: a shared machine's)."""
    from benchmarks.recovery import main

    (result,) = main(["--scenario", "kill", "--quick", "--timeout", "200"])
    out = capsys.readouterr().out
    for row in ("detection: rank 0's process gone", "restart + restore: every rank's first step", "steps lost"):
        assert row in out, row
    assert result["status"] == 0 and result["done"] == 2, result
    assert result["committed_at_signal"] <= result["restored"] <= result["step_at_signal"], result
    assert 0 < result["detect_exit"] < result["first_steps"], result


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (apt-get install valgrind)")
def test_distributed_benchmark_instruction_counts(capsys):
    """--instructions: rank 0 under callgrind, every loop's instructions per step, the agreement's
    ratio judged against the target, next to the timing ratios. One callgrind job (``--runs 1``):
    each costs ~25 s of CPU before its first counted step (torch's import under valgrind); the
    second job's column and run-to-run difference: test_a_table_of_two_runs_prints_both_counts
    (tests/test_benchmarks_smoke.py)."""
    from benchmarks.distributed import LOOPS, main

    ratios = main(["--instructions", "--quick", "--n", "3", "--runs", "1"])
    out = capsys.readouterr().out
    assert "timing (2 ranks native" in out
    counts, main_thread = out.split("instructions per steady-state step", 1)[1].split("the training thread alone", 1)
    assert all(x + " " in main_thread for x in LOOPS)
    for loop in LOOPS:
        (line,) = [x for x in counts.splitlines() if x.strip().startswith(loop + " ")]
        assert re.search(r"\d+ +-  n/a \(one run\) +\d\.\d{4}x \(run 2: -\)", line), line
    (agreement,) = [x for x in counts.splitlines() if x.strip().startswith("agreement ")]
    assert ("  ok;" in agreement) != ("MISSES TARGET;" in agreement), agreement
    assert set(LOOPS) <= set(ratios) and ratios["bare"] == ratios["bare [main thread]"] == 1.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_scale_benchmark_quick(capsys):
    """benchmarks/scale.py --quick: every section prints its rows and its projection to W=1,000
    (figures not asserted here but the blame, which tests/distributed/test_scale.py owns)."""
    from benchmarks.scale import FIGURES, main

    figures = main(["--quick", "--baseline", "none"])
    out = capsys.readouterr().out
    assert set(FIGURES) <= set(figures)
    assert sorted(figures["coordination"]["this"]) == [2, 4], out
    assert "projected to W=1000: this: store requests per rank per step" in out
    assert sorted(figures["blame"]["this"]) == [(4, "kill")], out
