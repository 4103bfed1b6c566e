"""The checkpoint benchmark stays runnable and prints every row of its table (its timings are
not asserted here: they belong to ``benchmarks/``, not to a test on a shared machine)."""
from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil

import pytest
import torch

from benchmarks.checkpoint import main

ROWS = (
    "stall: async save() blocks the loop",
    "stall vs a bare memcpy of the state",
    "stall: save at a boundary, with a listener",
    "write: save() to commit, MiB/s",
    "  same, retention deleting in the window",
    "restore: verified restore vs torch.load",
    "memory: peak extra RSS, 1st async save",
    "memory: RSS after 50 saves vs 2",
)
DCP_ROWS = tuple(f"vs DCP: {figure} @ {shape}" for shape in ("32 MiB", "200 x 64 KiB")
                 for figure in ("stall", "save-to-commit", "verified restore"))
DCP_FIGURES = ("ours: async save() stall", "ours: save to commit", "DCP async_save stall", "DCP save + fsync",
               "torch.save + fsync", "ours: verified restore", "DCP load", "torch.load")


@pytest.mark.slow
def test_checkpoint_benchmark_quick(capsys, tmp_path):
    rows = main(["--quick", "--repeats", "2", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    table = out.split("\nfigure", 1)[1]
    for name in ROWS + DCP_ROWS:
        (line,) = [row for row in table.splitlines() if row.startswith(name)]
        assert line.rstrip().endswith(("ok", "MISSES TARGET", "(info)")), line
    assert [r.name for r in rows] == list(ROWS + DCP_ROWS)
    comparison = out.split("vs torch.distributed.checkpoint", 1)[1].split("\nfigure", 1)[0]
    for figure in DCP_FIGURES:  # each shape prints every figure as median (min-max)
        lines = [row for row in comparison.splitlines() if row.strip().startswith(figure)]
        assert len(lines) == 2 and all(re.search(r"\d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\)$", x) for x in lines), lines
    assert all(r.ratio > 0 for r in rows)
    assert "phase breakdown of one save:" in out
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone


@pytest.mark.slow
def test_step_overhead_benchmark_quick(capsys):
    from benchmarks.step_overhead import main as step_overhead

    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    step_overhead(["--quick"])
    # it pinned itself to one CPU and one intra-op thread while it ran, not after
    assert os.sched_getaffinity(0) == cpus and torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert "pinned to CPU" in out
    for row in ("0 hooks", "5 no-op before_run/after_run hooks", "StopAtStepHook", "bare loop",
                "MonitoredTrainingSession, default hooks", "Supervisor.managed_session(), default services",
                "low-noise"):
        assert row in out, row
    loops = out.split("tiny CPU model", 1)[1].split("low-noise", 1)[0]
    for row in ("MonitoredTrainingSession, default hooks", "MonitoredTrainingSession, no default hooks",
                "Supervisor.managed_session(), default services"):
        lines = [x for x in loops.splitlines() if x.strip().startswith(row)]
        assert len(lines) == 3, lines  # wall-clock ratio, all rounds pooled, process CPU-time ratio
        wall, pooled, cpu = lines
        for line in (wall, cpu):
            assert re.search(r"\d\.\d{3}x \(\d\.\d{3}-\d\.\d{3}\)  (ok|MISSES TARGET)$", line), line
        assert re.search(r"  \d\.\d{3}x  (ok|MISSES TARGET)$", pooled), pooled


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_benchmark_runs_on_the_cpu(capsys, tmp_path):
    """benchmarks/gpu.py --device cpu, CI's smoke run: every figure, ratio and check is printed
    (a failure of a DCP variant is printed as its figure, not raised)."""
    from benchmarks.gpu import FIGURES, main as gpu

    result = gpu(["--device", "cpu", "--size-gib", "0.002", "--rounds", "1", "--every", "2", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    for name in FIGURES:
        (line,) = [x for x in out.splitlines() if x.strip().startswith(name)]
        assert re.search(r"\d\.\d{4} \(\d\.\d{4}-\d\.\d{4}\)$", line) or "FAILED: " in line, line
    for ratio in ("blocking stall / pinned memcpy", "save to commit / DCP save", "verified restore / DCP load",
                  "overlapped stall / pinned memcpy", "overlapping step / step without a save (overlapped)",
                  "device fingerprint / pinned memcpy", "staged-copy fingerprint (CPU) / pinned memcpy"):
        (line,) = [x for x in out.splitlines() if x.strip().startswith(ratio)]
        assert re.search(r"\d\.\d{3}x  (target <= [\d.]+x  (ok|MISSES TARGET)|\(info\))$", line) \
            or "n/a (not available" in line, line
    assert "capture=blocking    saving step" in out
    assert result["resume"][0], result["resume"]  # bit-exact resume (on the CPU here)
    assert result["agreement"][0], result["agreement"]  # both DDP ranks stop at the same step
    assert result["detection"][0], result["detection"]  # a torn write is discarded, the next save is exact
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (apt-get install valgrind)")
def test_step_overhead_instruction_counts(capsys):
    """--instructions: every variant's instructions per step and the ratio judged against the
    target. One callgrind run (``--runs 1``): each costs ~35 s of CPU before its first counted
    step (torch's import and the variants' first steps under valgrind); the second run's column
    and the run-to-run difference: test_a_table_of_two_runs_prints_both_counts."""
    from benchmarks.step_overhead import main as step_overhead

    step_overhead(["--instructions", "--quick", "--n", "5", "--runs", "1"])
    out = capsys.readouterr().out.split("instructions per steady-state step", 1)[1]
    for row in ("MonitoredTrainingSession, default hooks", "Supervisor.managed_session(), default services"):
        (line,) = [x for x in out.splitlines() if x.strip().startswith(row)]
        assert re.search(r"\d+ +-  n/a \(one run\) +\d\.\d{4}x  (ok|MISSES TARGET)$", line), line
    assert re.search(r"run\(\) of a no-op step, 0 hooks: -?\d+ instructions .*\(run 2: -\)", out), out


def test_a_table_of_two_runs_prints_both_counts_and_their_difference(capsys):
    """The benchmarks' default (two callgrind runs, which the smokes above skip): each row has
    both counts, their run-to-run difference judged at 0.1 % and each run's ratio."""
    from benchmarks import _callgrind
    from benchmarks.distributed_instructions import LOOPS, _table

    first = {loop: 100_000.0 + 1_000 * i for i, loop in enumerate(LOOPS)}
    second = {loop: count * (1.002 if loop == "naive" else 1.0005) for loop, count in first.items()}
    ratios = _table(first, second)
    out = capsys.readouterr().out
    for loop in LOOPS:
        (line,) = [x for x in out.splitlines() if x.strip().startswith(loop + " ")]
        verdict = "NOT deterministic: > 0.1 %" if loop == "naive" else "deterministic"
        assert re.search(rf"\d+ +\d+  \+0\.\d{{3}} % \({verdict}\) +\d\.\d{{4}}x \(run 2: \d\.\d{{4}}x\)", line), line
    assert ratios["bare"] == 1.0 and _callgrind.second_run(None).strip() == "-"
    assert _callgrind.run_to_run(1.0, None) == "n/a (one run)"


def test_benchmarks_import_each_other_without_a_circle():
    """Every ``benchmarks.*`` import, function-level ones included, points one way: what two
    benchmarks share lives in a third module (``_step_loops``, ``_ddp_loops``, ``_callgrind``,
    ``_ranks``), and ``--instructions`` dispatches from the timing script to the callgrind one."""
    root = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"
    graph = {path.stem: _benchmark_imports(path) for path in root.glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + (module,))}"
        if module not in done:
            for imported in graph.get(module, ()):
                visit(imported, path + (module,))
            done.add(module)

    for module in graph:
        visit(module, ())
    assert "step_instructions" in graph["step_overhead"] and "distributed_instructions" in graph["distributed"]


def _benchmark_imports(path: pathlib.Path) -> set[str]:
    """The ``benchmarks`` modules that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks."))
    return found


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed (apt-get install valgrind)")
def test_callgrind_worker_runs_in_the_callers_virtual_environment(tmp_path):
    """The worker runs under the interpreter of the caller's virtual environment (issue 30 item
    0), not the base interpreter a venv's ``bin/python`` symlink resolves to, which lacks what
    the venv installed: a venv (this interpreter's packages visible, for torch) with one module
    of its own, and a caller in it whose callgrind worker imports that module."""
    import subprocess
    import sys
    import venv

    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(tmp_path / "v")
    python = tmp_path / "v" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(site, "only_in_the_venv.py").write_text("HERE = True\n")
    worker = "import only_in_the_venv; from benchmarks import _callgrind; _callgrind.print_marks([])"
    caller = f"from benchmarks import _callgrind; print(_callgrind.run_worker(['-c', {worker!r}], 240)[0])"
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([python, "-c", caller], capture_output=True, text=True, timeout=280, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "{}"
