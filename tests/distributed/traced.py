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
_CALL = re.compile(r"^(\d+)\s+(" + "|".join(READS) + r")\((\d+)<([^>]*)>(.*)")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. (" + "|".join(READS) + r") resumed>(.*)")
_MMAP = re.compile(r"^(\d+)\s+mmap\([^,]*,\s*(\d+),[^<]*<([^>]*)>")
_RESULT = re.compile(r"=\s+(-?\d+|0x[0-9a-f]+)(?:\s.*)?$")


def strace_works() -> bool:
    """Whether ``strace -P`` can trace a child here (ptrace may be forbidden in a container)."""
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-qq", "-f", "-e", "trace=read", "-P", sys.executable, "true"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def bytes_read(trace: str) -> dict[str, int]:
    """Per file, the bytes the read calls in an ``strace -y -o`` file returned (an ``mmap`` of a
    traced file counts as its whole length, as if read)."""
    per_file: dict[str, int] = {}
    pending: dict[str, tuple[str, str, str]] = {}  # pid -> (call, path, args) of an unfinished call
    with open(trace) as f:
        for line in f:
            mapped = _MMAP.match(line)
            if mapped:  # a map of a traced file: as if its length were read
                per_file[mapped.group(3)] = per_file.get(mapped.group(3), 0) + int(mapped.group(2))
                continue
            call = _CALL.match(line)
            if call:
                pid, name, _, path, rest = call.groups()
                if rest.endswith("<unfinished ...>"):
                    pending[pid] = (name, path, rest)
                    continue
            else:
                resumed = _RESUMED.match(line)
                if not resumed or resumed.group(1) not in pending:
                    continue
                name, path, rest = pending.pop(resumed.group(1))
                rest += resumed.group(3)
            result = _RESULT.search(rest)
            if result is None or result.group(1).startswith("-"):
                continue
            per_file[path] = per_file.get(path, 0) + int(result.group(1))
    return per_file


def run_traced(module: str, scenario: str, world_size: int, args: list[str], files: list[str], out_dir: str,
               *, timeout: float = 240.0, pythonpath: str | None = None,
               cwd: str = ROOT) -> tuple[list[RankResult], list[dict[str, int]]]:
    """Runs ``scenario`` on ``world_size`` gloo ranks, each under strace tracing ``files``;
    returns the ranks' results and, per rank, the bytes it read of each of those files. ``pythonpath`` and
    ``cwd``: the code under test (default: this checkout; ``python -m`` puts ``cwd`` first)."""
    port = free_port()
    traced = [a for f in files for a in ("-P", f)]  # none: every read call (filter the paths after)
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
    return results, [bytes_read(t) if os.path.exists(t) else {} for t in traces]
