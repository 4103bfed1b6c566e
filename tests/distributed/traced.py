"""Counting the bytes each rank reads from a checkpoint's files, from outside the process:
every rank runs under ``strace -f -P <file> ...`` (only the system calls on those files are
traced, with a seccomp filter so the others run at full speed) and the return values of its
read calls (``read``, ``pread64``, ``readv``, ``preadv``, ``preadv2``, ``sendfile``,
``copy_file_range``) are summed per rank. Nothing in the product reports these numbers."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

from .harness import ROOT, RankResult, _kill, env_for, free_port

READS = ("read", "pread64", "readv", "preadv", "preadv2", "sendfile", "copy_file_range", "mmap")
_LINE = re.compile(r"^\d+\s+(?:<\.\.\. )?(" + "|".join(READS) + r")\b(.*)=\s+(-?\d+|0x[0-9a-f]+)")


def strace_works() -> bool:
    """Whether ``strace -P`` can trace a child here (ptrace may be forbidden in a container)."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-qq", "-f", "-e", "trace=read", "-P", sys.executable, "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def bytes_read(trace: str) -> int:
    """The bytes the read calls in an ``strace -o`` file returned (an ``mmap`` of a traced file
    counts as its whole length, as if read)."""
    total = 0
    with open(trace) as f:
        for line in f:
            m = _LINE.match(line)
            if not m or m.group(3).startswith("-"):
                continue
            if m.group(1) == "mmap":
                args = m.group(2).split(",")
                total += int(args[1].strip()) if len(args) > 1 and args[1].strip().isdigit() else 0
            else:
                total += int(m.group(3))
    return total


def run_traced(module: str, scenario: str, world_size: int, args: list[str], files: list[str], out_dir: str,
               *, timeout: float = 240.0, pythonpath: str | None = None,
               cwd: str = ROOT) -> tuple[list[RankResult], list[int]]:
    """Runs ``scenario`` on ``world_size`` gloo ranks, each under strace tracing ``files``;
    returns the ranks' results and the bytes each read of those files. ``pythonpath`` and
    ``cwd``: the code under test (default: this checkout; ``python -m`` puts ``cwd`` first)."""
    port = free_port()
    traced = [a for f in files for a in ("-P", f)]
    procs, traces = [], []
    for r in range(world_size):
        env = env_for(r, world_size, port)
        if pythonpath is not None:
            env["PYTHONPATH"] = pythonpath
        trace = os.path.join(out_dir, f"strace-{r}.txt")
        traces.append(trace)
        cmd = ["strace", "-qq", "-f", "--seccomp-bpf", "-y", "-e", "trace=" + ",".join(READS), "-e", "signal=none",
               "-o", trace, *traced, sys.executable, "-m", module, scenario, *args]
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
    return results, [bytes_read(t) if os.path.exists(t) else 0 for t in traces]
