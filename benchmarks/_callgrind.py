"""Instruction counts under ``valgrind --tool=callgrind``: figures no scheduler noise can move.

A worker process runs under callgrind and calls `mark` after each phase it wants counted;
`mark` makes callgrind dump (and zero) the counts of *every* thread of the process since the
previous mark (``CALLGRIND_DUMP_STATS`` through torch's own binding,
``torch._C._valgrind_toggle_and_dump_stats``; a no-op when not under valgrind). The worker
prints one JSON line naming its marks in order; `run_worker` pairs them with the dump files.

Steady state per step: a variant runs W warm-up steps, then N steps (mark), then 2N steps
(mark); ``(count(2N) - count(N)) / N`` cancels everything a run pays once (the loop's entry and
exit, the marks themselves) and leaves what one more step costs. N is best a multiple of every
step-based trigger's period (100 by default), so both windows see the same share of
triggering steps.

Instrumentation starts after the imports: the parent compiles a four-line C helper
(``CALLGRIND_START_INSTRUMENTATION`` from valgrind's callgrind.h) and runs the worker with
``--instr-atstart=no``; the worker calls `start` once torch and the runtime are imported, so the
~50x slowdown applies to the measured part only (importing torch under full instrumentation
costs minutes of CPU on a shared 2-core machine). Without a C compiler or the header, the whole
process is instrumented (slower, same counts).

Time-based work (a service every 120 s) stays rare under callgrind as outside it, but callgrind
runs the process ~50x slower, so a thread polling every second wakes ~50x more often per step:
`run_worker` is therefore run twice and the two counts compared; a difference above ~0.1 % names
such noise.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, NoReturn, Sequence

MARKER = "CALLGRIND-MARKS "
HELPER_ENV = "SUPERVISOR_CALLGRIND_HELPER"
_HELPER_C = """#include <valgrind/callgrind.h>
void supervisor_callgrind_start(void) { CALLGRIND_START_INSTRUMENTATION; }
"""


def available() -> str | None:
    """None when callgrind can run here; else why not."""
    import torch  # here, not at import: a worker that only prints its marks starts without it

    if shutil.which("valgrind") is None:
        return "valgrind not installed (Debian: apt-get install valgrind)"
    if not torch._C._valgrind_supported_platform():
        return "this torch build has no valgrind client requests"
    return None


def build_helper(directory: str) -> str | None:
    """Compiles the start-instrumentation helper into ``directory``; None when it cannot."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        return None
    source, library = os.path.join(directory, "helper.c"), os.path.join(directory, "helper.so")
    with open(source, "w") as f:
        f.write(_HELPER_C)
    built = subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", library, source], capture_output=True)
    return library if built.returncode == 0 else None


def start() -> None:
    """Starts callgrind's instrumentation (the parent started it off); no-op otherwise."""
    library = os.environ.get(HELPER_ENV)
    if library:
        import ctypes

        ctypes.CDLL(library).supervisor_callgrind_start()


def mark() -> None:
    """Dumps (and zeroes) callgrind's counts of every thread; collection stays on."""
    import torch  # the worker imported it long before (sys.modules: no cost here)

    torch._C._valgrind_toggle_and_dump_stats()  # toggles this thread's collection off, dumps
    torch._C._valgrind_toggle()  # and back on


def steady_phases(label: str, step: Callable[[], object], n: int, warmup: int, marks: list[str]) -> None:
    """Runs ``warmup``, then ``n``, then ``2 n`` calls of ``step``, marking after each."""
    for count, name in ((warmup, "warm"), (n, "N"), (2 * n, "2N")):
        for _ in range(count):
            step()
        mark()
        marks.append(f"{label}:{name}")


def per_step(counts: dict[str, int], label: str, n: int, raw: bool = False) -> float:
    """Instructions of one steady-state step: (2N run - N run) / N. ``raw``: ``label`` is the
    2N mark's full key (e.g. ``"bare:2N [main thread]"``); the N mark's is derived from it."""
    if raw:
        return (counts[label] - counts[label.replace(":2N", ":N", 1)]) / n
    return (counts[f"{label}:2N"] - counts[f"{label}:N"]) / n


def _totals(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in callgrind dump {path}")


def run_worker(argv: Sequence[str], timeout_secs: float = 1200, env: dict[str, str] | None = None,
               keep: str | None = None, main_thread: bool = False) -> tuple[dict[str, int], str]:
    """Runs ``python argv`` under callgrind with this process's own interpreter, ``sys.executable``
    unresolved: a virtual environment's ``bin/python`` is a symlink to the base interpreter, and
    only the unresolved path finds the venv's ``pyvenv.cfg`` and packages (torch among them).
    It is a real interpreter, not a pyenv shim, so no ``--trace-children`` is needed. Returns
    {mark label: instructions since the previous mark} (every thread; with ``main_thread`` also
    ``"<label> [main thread]"``: the training thread alone, from ``--separate-threads=yes``) and
    the directory of the dumps (kept only when ``keep`` names it, for callgrind_annotate)."""
    out_dir = keep or tempfile.mkdtemp(prefix="callgrind-")
    os.makedirs(out_dir, exist_ok=True)
    helper = build_helper(out_dir)
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_dir}/cg.%p",
               *(["--instr-atstart=no"] if helper else []), *(["--separate-threads=yes"] if main_thread else []),
               sys.executable, *argv]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_secs,
                              env={**os.environ, **(env or {}), HELPER_ENV: helper or ""})
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind worker failed ({proc.returncode}): {proc.stderr[-3000:]}")
        labels = json.loads([x for x in proc.stdout.splitlines() if x.startswith(MARKER)][-1][len(MARKER):])
        pid = re.search(r"==(\d+)== Callgrind", proc.stderr).group(1)  # type: ignore[union-attr]
        return _read_dumps(out_dir, pid, labels), out_dir
    finally:
        if keep is None:
            shutil.rmtree(out_dir, ignore_errors=True)


def _read_dumps(out_dir: str, pid: str, labels: list[str]) -> dict[str, int]:
    """{label: every thread's total} (+ ``"<label> [main thread]"`` with per-thread dumps)."""
    per_dump: dict[int, dict[int, int]] = {}
    for name in os.listdir(out_dir):
        found = re.fullmatch(rf"cg\.{pid}\.(\d+)(?:-(\d+))?", name)
        if found:
            thread = int(found.group(2) or 0)
            per_dump.setdefault(int(found.group(1)), {})[thread] = _totals(os.path.join(out_dir, name))
    if len(per_dump) != len(labels):
        raise RuntimeError(f"{len(per_dump)} callgrind dumps for {len(labels)} marks")
    counts: dict[str, int] = {}
    for label, number in zip(labels, sorted(per_dump)):
        threads = per_dump[number]
        counts[label] = sum(threads.values())
        if 1 in threads:
            counts[f"{label} [main thread]"] = threads[1]
    return counts


def run_twice(argv: Sequence[str], timeout_secs: float = 1200) -> tuple[dict[str, int], dict[str, int]]:
    """Two callgrind runs of the same worker, concurrently (the counts do not depend on the
    schedule; the wall time halves on a machine with two cores)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        first, second = [pool.submit(run_worker, argv, timeout_secs) for _ in range(2)]
        return first.result()[0], second.result()[0]


def run_once_or_twice(argv: Sequence[str], runs: int, timeout_secs: float = 1200
                      ) -> tuple[dict[str, int], dict[str, int] | None]:
    """`run_twice` (``runs`` = 2), or one run and None for the second's counts (``runs`` = 1: a
    smoke run, the counts without their run-to-run difference)."""
    if runs == 2:
        return run_twice(argv, timeout_secs)
    return run_worker(argv, timeout_secs)[0], None


def second_run(b: float | None) -> str:
    """The second run's count for a table's column (``-`` when there was one run)."""
    return f"{b:10.0f}" if b is not None else f"{'-':>10s}"


def run_to_run(a: float, b: float | None) -> str:
    """`deterministic`, or ``n/a (one run)``."""
    return deterministic(a, b) if b is not None else "n/a (one run)"


def deterministic(a: float, b: float) -> str:
    """``+0.012 %`` and whether two runs' counts agree to 0.1 %."""
    diff = (b - a) / a * 100 if a else 0.0
    return f"{diff:+.3f} % ({'deterministic' if abs(diff) <= 0.1 else 'NOT deterministic: > 0.1 %'})"


def print_marks(labels: list[str]) -> None:
    print(MARKER + json.dumps(labels), flush=True)


def exit_worker() -> NoReturn:
    """Ends a worker process once its work is done, without Python's finalization: under
    callgrind that teardown (every module, tensor and thread state) runs instrumented, ~8 s of
    CPU per worker that no mark counts. Callgrind still writes its final dump at exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
