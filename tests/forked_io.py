"""What tests read of a `tests.zygote.Forked` process, as they read a ``subprocess.Popen``'s pipes.

A forked process writes its output into a file (``Forked(..., output=FILE)``, stderr too unless
``stderr=FILE``); these read it: whole (`output`), after the process ended (`communicate`, as
``Popen.communicate(timeout=...)``), or while it runs, until a text appears (`wait_for`: the
process must write unbuffered, ``PYTHONUNBUFFERED=1`` in its environment, as ``python -u``).
Every wait is bounded.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time

from tests import zygote


_scratch: list[str] = []


def code(source: str, args: list[object] = (), **kwargs) -> zygote.Forked:  # type: ignore[assignment]
    """``python -c SOURCE ARGS`` as a `zygote.Forked` (which runs scripts): ``source`` is written
    to a script in a scratch directory this process removes at exit, and so is its output unless
    ``output=`` names a file. ``kwargs``: `zygote.Forked`'s."""
    if not _scratch:
        _scratch.append(tempfile.mkdtemp(prefix="forked-code-"))
        atexit.register(shutil.rmtree, _scratch[0], True)
    script = new_file(_scratch[0], "code")
    with open(script, "w") as f:
        f.write(source)
    kwargs.setdefault("output", script + ".out")
    return zygote.Forked(script, list(args), **kwargs)


def unbuffered(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with ``PYTHONUNBUFFERED=1``: ``python -u``."""
    return {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}


def new_file(directory: str, prefix: str) -> str:
    """A new, empty file in ``directory`` for a process's output (``prefix-XXXX.out``)."""
    fd, path = tempfile.mkstemp(prefix=prefix + "-", suffix=".out", dir=str(directory))
    os.close(fd)
    return path


def output(proc: zygote.Forked, path: str | None = None) -> str:
    """What the process wrote so far into ``path`` (default: its ``output`` file)."""
    try:
        with open(path or proc.output, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def communicate(proc: zygote.Forked, timeout: float | None = None) -> str:
    """Its output once it ended (``subprocess.TimeoutExpired`` after ``timeout`` seconds, as
    ``Popen.communicate``; the process is not killed)."""
    proc.wait(timeout)
    return output(proc)


def finish(proc: zygote.Forked, timeout: float = 60) -> str:
    """Kills the process if it still runs, waits for its end; its output."""
    proc.kill()
    return communicate(proc, timeout)


def wait_for(proc: zygote.Forked, text: str, timeout: float, path: str | None = None) -> str:
    """The output (of ``path``, default its ``output`` file) once ``text`` is in it; an
    AssertionError with the output if the process ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while text not in (seen := output(proc, path)):
        if proc.poll() is not None:
            seen = output(proc, path)
            if text in seen:
                return seen
            raise AssertionError(f"the process exited ({proc.returncode}) before {text!r}:\n{seen[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} within {timeout} s:\n{seen[-3000:]}")
        time.sleep(0.01)
    return seen


def lines(proc: zygote.Forked, count: int, timeout: float) -> list[str]:
    """Its first ``count`` output lines (without their ends), once it wrote them (bounded, as
    `wait_for`): ``Popen.stdout.readline()`` ``count`` times."""
    deadline = time.monotonic() + timeout
    while (seen := output(proc)).count("\n") < count:
        if proc.poll() is not None and output(proc).count("\n") < count:
            raise AssertionError(f"the process exited ({proc.returncode}) before {count} lines:\n{seen[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {count} lines within {timeout} s:\n{seen[-3000:]}")
        time.sleep(0.01)
    return seen.split("\n")[:count]
