"""Test subprocesses without paying ``import torch`` per process: each is forked from a *zygote*.

Every ``python ...`` a test starts used to cost ~4 s of CPU before it did anything (importing
torch, torch.distributed, DCP and the runtime) and again at exit, on CI's 2 cores: the suite
started ~1,000 of them. Here each test process starts one zygote (on first use, ended at exit)
that imports `PRELOADED` once and then forks one child per command:

- `python` behaves like ``subprocess.run([sys.executable, *args], capture_output=True,
  text=True, timeout=..., env=..., cwd=...)`` for ``SCRIPT ARGS``, ``-m MODULE ARGS`` or
  ``-c CODE ARGS`` (`run`: ``-m supervisor ARGS``, the CLI);
- `Forked` is a `subprocess.Popen` look-alike (pid, poll, wait, kill, send_signal, a stdin pipe,
  its own session) whose output goes to a file, for tests that signal what they started
  (SIGKILL, SIGSTOP) or read it while it runs; tests/distributed/harness.py starts ranks with it.

A child is a separate process with its own pid, exit status (``-N`` for signal N), environment,
working directory, fds 0-2, and the seeds and thread count a fresh interpreter would have
(`_as_a_fresh_interpreter`); the script runs as ``python`` runs it (``runpy``), an uncaught
exception gives its traceback and status 1, non-daemon threads are joined and atexit handlers
run at exit, but modules are not torn down (see `_finish`). What a fork cannot give: the
zygote's string hash seed, its imported modules (so the zygote imports nothing that reads the
environment at import: fsspec, s3fs and botocore are imported by the child after its environment
is set; a child whose ``PYTHONPATH`` holds another checkout is refused; what torch and tqdm read
at import, ``TORCH_*`` and ``TQDM_*``, is the zygote's, so a test that sets those needs a fresh
interpreter), and anything about the
interpreter's own start or exit (peak RSS, import side effects, the status 141 of a pipe closed
early): tests about those, and torchrun's workers, start fresh interpreters.

Protocol: one JSON line per command on the zygote's stdin (what to run, argv, cwd, env, and the
paths of its stdin, stdout, stderr, pid and status files); the zygote forks, the child redirects
fds 0-2 and runs the command, the zygote writes the child's pid at once and its exit status once
it is reaped, each file renamed into place whole.
"""
from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Modules that read the environment when imported: the zygote must not have them.
_READS_ENV_AT_IMPORT = ("fsspec", "s3fs", "botocore", "aiobotocore", "boto3")

#: What the zygote imports once, so that no child pays for it: the CLI, and the torch.distributed
#: and DCP modules that each rank of tests/distributed's jobs would import (~2x torch's own import).
PRELOADED = ("supervisor.cli", "hooks", "torch.distributed", "torch.distributed.checkpoint",
             "torch.nn.parallel")

_lock = threading.Lock()
_zygote: subprocess.Popen | None = None
_scratch: str | None = None
_count = 0
_CPU_THREADS = 1


def run(args: Sequence[object], *, timeout: float, env: Mapping[str, str] | None = None,
        cwd: str | None = None, module: str = "supervisor") -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` (``supervisor``: the CLI), forked from the zygote (see the
    module docstring)."""
    return python(["-m", module, *args], timeout=timeout, env=env, cwd=cwd)


def python(args: Sequence[object], *, timeout: float, env: Mapping[str, str] | None = None,
           cwd: str | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
    env=env, cwd=cwd)``, forked from the zygote. ``args``: ``SCRIPT ARGS``, ``-m MODULE ARGS`` or
    ``-c CODE ARGS``, optionally after ``-u`` (PYTHONUNBUFFERED)."""
    argv, env = [str(a) for a in args], dict(os.environ if env is None else env)
    command = [sys.executable, *argv]
    if argv[0] == "-u":
        argv, env["PYTHONUNBUFFERED"] = argv[1:], "1"
    what = {"-m": argv[1], "-c": "code:" + argv[1]}.get(argv[0]) if argv[0] in ("-m", "-c") else None
    what, argv = (what, argv[2:]) if what else ("path:" + os.path.abspath(argv[0]), argv[1:])
    files = _send(what, argv, env, os.path.abspath(cwd or os.getcwd()))
    deadline = time.monotonic() + timeout
    while not os.path.exists(files["status"]):
        if time.monotonic() > deadline:
            _kill(files)
            raise subprocess.TimeoutExpired(command, timeout, _read(files["stdout"]), _read(files["stderr"]))
        time.sleep(0.005)
    code = int(_read(files["status"]))
    result = subprocess.CompletedProcess(command, code, _read(files["stdout"]), _read(files["stderr"]))
    for path in files.values():
        os.unlink(path)
    return result


class Forked:
    """A ``python SCRIPT ARGS`` (or, with ``module``, ``python -m MODULE ARGS``) started like
    ``subprocess.Popen(..., stdout=file, stderr=STDOUT)`` but forked from the zygote: ``pid``
    (signal it at will: SIGKILL, SIGSTOP, SIGCONT), ``poll()``, ``wait(timeout)``, ``kill()``,
    ``send_signal()`` and ``returncode`` as `subprocess.Popen` has them. Its output goes to the
    file ``output`` names. ``new_session``: as ``start_new_session=True`` (its own process group,
    which `kill_group` SIGKILLs). ``stdin_pipe``: as ``stdin=subprocess.PIPE``, ``stdin`` is the
    (unbuffered, binary) write end of a pipe the child reads as its fd 0; without it fd 0 is
    ``/dev/null``."""

    def __init__(self, script: str | None, args: Sequence[object], *, output: str,
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 module: str | None = None, new_session: bool = False, stdin_pipe: bool = False,
                 stdin: str = os.devnull, stderr: str | None = None) -> None:
        argv = [str(a) for a in args]
        self.output = output
        self.args = [sys.executable, *(["-m", module] if module else [script]), *argv]
        open(output, "w").close()  # exists (empty) from now on, as Popen's caller opened it
        self.stdin, self._stdin_read = None, None
        if stdin_pipe:  # the child opens the read end by its /proc name, which this process keeps open
            self._stdin_read, write = os.pipe()
            self.stdin, stdin = os.fdopen(write, "wb", buffering=0), f"/proc/{os.getpid()}/fd/{self._stdin_read}"
        self._files = _send(module or "path:" + os.path.abspath(script), argv,
                            dict(os.environ if env is None else env), os.path.abspath(cwd or os.getcwd()),
                            output=output, new_session=new_session, stdin=stdin, stderr=stderr)
        self.pid = int(_read(_appeared(self._files["pid"])))
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and os.path.exists(self._files["status"]):
            self.returncode = int(_read(self._files["status"]))
            if self._stdin_read is not None:  # the child is gone: nobody opens it any more
                os.close(self._stdin_read)
                self._stdin_read = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # it ended, and the zygote reaped it, just now
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def kill_group(self) -> None:
        """SIGKILLs its process group (``new_session``), or itself if it has not made one yet."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # not a group leader yet (or gone): the process alone
            self.kill()


def _send(module: str, argv: list[str], env: dict[str, str], cwd: str, output: str | None = None,
          new_session: bool = False, stdin: str = os.devnull, stderr: str | None = None) -> dict[str, str]:
    global _count
    with _lock:
        zygote = _start()
        _count += 1
        base = os.path.join(_scratch, str(_count))  # type: ignore[arg-type]
        files = {name: f"{base}.{name}" for name in ("stdout", "stderr", "pid", "status")}
        if output is not None:  # stdout and stderr into one file, as stderr=subprocess.STDOUT
            files["stdout"] = files["stderr"] = output
        if stderr is not None:
            files["stderr"] = stderr
        zygote.stdin.write(json.dumps({"module": module, "argv": argv, "env": env, "cwd": cwd, "files": files,
                                        "new_session": new_session, "stdin": stdin}) + "\n")  # type: ignore[union-attr]
        zygote.stdin.flush()  # type: ignore[union-attr]
    return files


def _start() -> subprocess.Popen:
    """The zygote, started once (under `_lock`)."""
    global _zygote, _scratch
    if _zygote is None or _zygote.poll() is not None:
        _scratch = tempfile.mkdtemp(prefix="forked-cli-")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        _zygote = subprocess.Popen([sys.executable, "-c", "from tests.zygote import serve; serve()"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        atexit.register(_stop, _zygote, _scratch)
        ready = _zygote.stdout.readline()  # type: ignore[union-attr]  # its imports do not count
        if ready != "ready\n":  # against the first command's timeout
            raise RuntimeError(f"the CLI zygote did not start (status {_zygote.wait()}); see its stderr above")
    return _zygote


def _stop(zygote: subprocess.Popen, scratch: str) -> None:
    zygote.stdin.close()  # type: ignore[union-attr]  # EOF: the zygote exits once its children did
    try:
        zygote.wait(30)
    except subprocess.TimeoutExpired:
        zygote.kill()
    shutil.rmtree(scratch, ignore_errors=True)


def _kill(files: dict[str, str]) -> None:
    """SIGKILLs a command that ran past its timeout, and waits until it was reaped."""
    try:
        os.kill(int(_read(_appeared(files["pid"]))), signal.SIGKILL)
    except ProcessLookupError:
        pass
    _appeared(files["status"])


def _appeared(path: str, secs: float = 120) -> str:
    """``path`` once the zygote wrote it (it writes a pid at once and a status at the child's
    exit); an error naming the zygote's state if it never does."""
    deadline = time.monotonic() + secs
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the CLI zygote never wrote {path} (zygote exit status: {_zygote and _zygote.poll()})")
        time.sleep(0.002)
    return path


def _read(path: str) -> str:
    """The file's text; empty if the command never got as far as creating it."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _write_whole(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


# ---------------------------------------------------------------- the zygote's side
def serve() -> None:
    """The zygote's loop: imports the CLI and what the test workers use once (`PRELOADED`),
    then forks one child per request line."""
    import importlib

    for name in PRELOADED:  # what every command would import: the point of the zygote
        importlib.import_module(name)

    global _CPU_THREADS
    import torch

    _CPU_THREADS = torch.get_num_threads()  # what a child without OMP_NUM_THREADS gets
    found = [m for m in _READS_ENV_AT_IMPORT if m in sys.modules]
    assert not found, f"the zygote imported {found}, which read the environment at import"
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the test process reads no more of it
    os.close(devnull)
    running: dict[int, str] = {}
    pending, reading = b"", True
    while reading or running:
        if reading and select.select([0], [], [], 0.01)[0]:
            data = os.read(0, 1 << 16)  # unbuffered: every line that arrived is seen now
            reading, pending = bool(data), pending + data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                _fork_one(json.loads(line), running)
        elif not reading:
            time.sleep(0.01)
        _reap(running)


def _fork_one(request: dict, running: dict[int, str]) -> None:
    """Forks the command of one request; the child's pid is written at once."""
    pid = os.fork()
    if pid == 0:
        _child(request)  # never returns: the command's exit ends the process
    running[pid] = request["files"]["status"]
    _write_whole(request["files"]["pid"], str(pid))


def _reap(running: dict[int, str]) -> None:
    for pid in list(running):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _write_whole(running.pop(pid), str(os.waitstatus_to_exitcode(status)))


def _child(request: dict) -> None:
    """Becomes ``python -m MODULE ARGV`` (``python SCRIPT ARGV`` for ``path:SCRIPT``, ``python -c
    CODE ARGV`` for ``code:CODE``): fds 0-2 redirected (the zygote's requests gone), then the
    module run as ``-m`` runs it (``supervisor/__main__.py`` for the CLI), the script or the code
    as ``python`` does; its exit is the process's."""
    if request.get("new_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _as_a_fresh_interpreter()
    _redirect(request.get("stdin", os.devnull), request["files"]["stdout"], request["files"]["stderr"])
    kind, _, what = request["module"].partition(":") if request["module"].startswith(("path:", "code:")) \
        else ("module", "", request["module"])
    sys.argv = [{"path": what, "code": "-c", "module": "-m"}[kind], *request["argv"]]
    sys.path[0] = {"path": os.path.dirname(what), "code": "", "module": os.getcwd()}[kind]  # as python has it
    try:
        _extend_path()
        if kind == "path":
            runpy.run_path(what, run_name="__main__")
        elif kind == "code":
            exec(compile(what, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_status(e)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(code)


def _extend_path() -> None:
    """The child's ``PYTHONPATH`` entries the zygote's path lacks, put where a fresh interpreter
    would (after the script's directory). One holding a package the zygote already imported
    (another checkout of the runtime) cannot be honoured by a fork: an error says so."""
    known = {os.path.abspath(p) for p in sys.path}
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [p for p in dict.fromkeys(extra) if p not in known]
    clash = [p for p in extra for name in ("supervisor", "hooks", "tests") if os.path.isdir(os.path.join(p, name))]
    if clash:
        raise SystemExit(f"forked from the test zygote, this process cannot import another checkout from "
                         f"PYTHONPATH {clash}: start a fresh interpreter (subprocess) for it")
    sys.path[1:1] = extra


def _as_a_fresh_interpreter() -> None:
    """What a fresh interpreter would have differently from a fork: its own seeds for `random`,
    numpy's global generator and torch's default generator (each seeded from the OS at import;
    every child of the zygote would otherwise draw the same numbers), and torch's thread count
    from this child's ``OMP_NUM_THREADS`` (the OpenMP runtime read the zygote's environment when
    torch loaded it). Only the string hash seed stays the zygote's."""
    import random

    import numpy as np
    import torch

    random.seed()
    np.random.seed()
    torch.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else _CPU_THREADS)


def _redirect(stdin: str, stdout: str, stderr: str) -> None:
    """fd 0 from ``stdin`` (/dev/null or a pipe), fds 1 and 2 into their files (one shared file description when they
    are the same file, as ``stderr=subprocess.STDOUT`` gives)."""
    for fd, path in ((0, stdin), (1, stdout), (2, stderr)):
        if fd == 2 and path == stdout:
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # not the zygote's buffered requests
    # stdout and stderr as a fresh interpreter opens them: stdout block-buffered into a file
    # (unbuffered under ``-u``/PYTHONUNBUFFERED), stderr line-buffered; not the zygote's pipe's.
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),
                                                   write_through=unbuffered)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), line_buffering=True,
                                                   write_through=True, errors="backslashreplace")


def _exit_status(e: SystemExit) -> int:
    """The status the interpreter gives ``sys.exit(e.code)``."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _finish(code: int) -> NoReturn:
    """The interpreter's exit, but for tearing down every module: non-daemon threads joined,
    atexit handlers run (logging's flush among them), stdout and stderr flushed; then the
    process ends. (Tearing down torch's ~200 MB of objects in a forked child copies most of
    the zygote's pages and took as long as importing torch: the ~2 s this module saves.)"""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # the interpreter's status when its final flush fails
    os._exit(code)
