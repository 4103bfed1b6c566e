"""Test jobs whose ranks each run under strace (`benchmarks._traced_reads`): the bytes each rank
reads of a checkpoint's files, counted from outside the process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from benchmarks._traced_reads import bytes_read, strace_command, strace_works
from .harness import ROOT, RankResult, env_for, free_port

__all__ = ["bytes_read", "run_traced", "strace_works"]


def run_traced(module: str, scenario: str, world_size: int, args: list[str], files: list[str], out_dir: str,
               *, timeout: float = 240.0, pythonpath: str | None = None,
               cwd: str = ROOT) -> tuple[list[RankResult], list[dict[str, int]]]:
    """Runs ``scenario`` on ``world_size`` gloo ranks, each under strace tracing ``files``;
    returns the ranks' results and, per rank, the bytes it read of each of those files. ``pythonpath`` and
    ``cwd``: the code under test (default: this checkout; ``python -m`` puts ``cwd`` first)."""
    port = free_port()
    procs, traces = [], []
    for r in range(world_size):
        env = env_for(r, world_size, port)
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        trace = os.path.join(out_dir, f"strace-{r}.txt")
        traces.append(trace)
        cmd = [*strace_command(trace, files), sys.executable, "-m", module, scenario, *args]
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    start, results = time.monotonic(), []
    try:
        for r, proc in enumerate(procs):
            try:
                out, _ = proc.communicate(timeout=max(0.1, timeout - (time.monotonic() - start)))
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                _kill(proc)
                out, _ = proc.communicate()
                code = None
            results.append(RankResult(r, code, out, time.monotonic() - start))
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill(proc)
                proc.communicate()
    return results, [bytes_read(t) if os.path.exists(t) else {} for t in traces]


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILLs the rank's process group (strace and the rank under it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
