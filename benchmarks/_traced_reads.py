"""Counting the bytes a process reads from given files, from outside it: the process runs under
``strace -f -y`` (with ``-P <file>`` for each file when they are known in advance; a seccomp filter
stops only the traced calls, so the rest runs at full speed), and the return values of its read
calls (``read``, ``pread64``, ``readv``, ``preadv``, ``preadv2``, ``sendfile``,
``copy_file_range``; an ``mmap`` of a traced file counts as its length) are summed per file.
Nothing in the product reports these numbers. Used by ``benchmarks/scale_restore.py`` and the
read-once restore tests."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

__all__ = ["READS", "bytes_read", "strace_command", "strace_works"]

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


def strace_command(trace: str, files: list[str]) -> list[str]:
    """The prefix that runs a command under strace, writing to ``trace``; ``files``: only the
    calls on these (none: every read call, to be filtered by path afterwards)."""
    traced = [a for f in files for a in ("-P", f)]
    return ["strace", "-qq", "-f", "--seccomp-bpf", "-y", "-e", "trace=" + ",".join(READS), "-e", "signal=none",
            "-o", trace, *traced]
