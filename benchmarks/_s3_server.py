"""A real S3-compatible server on loopback for the object-store benchmark: ``moto``'s S3 server
(``pip install "moto[server]"``, part of the ``[test]`` extra) in a subprocess on a free port,
stopped after.

Usage::

    with S3Server() as server:              # started, answering; killed at exit
        fs = fsspec.filesystem("s3", **server.storage_options())
        server.create_bucket("bench")

It runs this file as a script (``python benchmarks/_s3_server.py HOST PORT [PARENT_PID]``; it
exits when PARENT_PID does, so a killed benchmark leaves no server behind), which serves
moto's application with its writes serialised (`SerialWrites`, the same wrapper as the tests'
the tests' fixtures, tests/s3_fixtures.py): moto 5.2.1 checks ``If-None-Match``/``If-Match`` and then
stores the object in two unlocked steps on a threaded server, so two racing conditional writes
could both pass, which real S3 never allows. The benchmark has a single writer, so this changes
no figure; it keeps the server the tests trust. This module lives under ``benchmarks/`` (not
``tests/``) because a benchmark must not import the test suite; the suite may import it (as
``tests/test_benchmarks_smoke.py`` imports ``benchmarks.checkpoint``), so the two launchers can
become one.

The server is pure Python: on a small machine its CPU time is a large share of every figure,
and it competes with the client for the cores. Every side of a comparison pays it alike, so the
ratios mean something; the absolute MB/s do not predict a real object store's.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any, Callable, Iterable

import fsspec

__all__ = ["S3Server", "SerialWrites", "free_port", "CREDENTIALS"]

START_TIMEOUT_SECS = 30.0
#: What the server accepts (any key works with moto); set in the client's options, not the environment.
CREDENTIALS = {"key": "testing", "secret": "testing"}
_WRITES = {"PUT", "POST", "DELETE"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SerialWrites:
    """A WSGI wrapper: one lock around every PUT/POST/DELETE except multipart part uploads (which
    name no object yet), so conditional writes are atomic as on S3; reads stay concurrent."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in _WRITES or "partNumber=" in environ.get("QUERY_STRING", ""):
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))


class S3Server:
    """``moto``'s S3 server in a subprocess on a free loopback port.

    Args:
        host: the address to listen on (loopback by default: nothing outside this machine reaches it).
        timeout_secs: how long `start` waits for it to answer before raising ``RuntimeError``.
    """

    def __init__(self, host: str = "127.0.0.1", *, timeout_secs: float = START_TIMEOUT_SECS) -> None:
        self.host = host
        self.port = free_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.timeout_secs = timeout_secs
        self.process: subprocess.Popen | None = None
        self._stderr: Any = None

    def start(self) -> S3Server:
        """Starts the server and returns once it answers."""
        # Its log goes to a file, never a pipe: werkzeug logs every request, and a full pipe
        # would block the server.
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.host, str(self.port),
                                         str(os.getpid())], stdout=subprocess.DEVNULL, stderr=self._stderr)
        deadline = time.monotonic() + self.timeout_secs
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1).close()
                return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self._fail()
                time.sleep(0.05)

    def _fail(self) -> None:
        exited = self.process is not None and self.process.poll() is not None
        self._stderr.seek(0)
        stderr = self._stderr.read().decode(errors="replace")[-2000:]
        self.stop()
        why = "exited" if exited else f"did not answer within {self.timeout_secs} s"
        raise RuntimeError(f"the moto S3 server on {self.endpoint} {why}; is the extra installed "
                           f"(pip install \"moto[server]\")? Its stderr:\n{stderr}")

    def stop(self) -> None:
        """Kills the server (its objects live in its memory and go with it)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if self._stderr is not None and not self._stderr.closed:
            self._stderr.close()

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used so far (user + system, all its threads), from
        ``/proc``; None where that cannot be read (not Linux, or the server is gone)."""
        if self.process is None:
            return None
        try:
            with open(f"/proc/{self.process.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """fsspec/``s3fs`` options that reach this server (``storage_options=`` of the runtime,
        ``**kwargs`` of DCP's ``FsspecWriter``/``FsspecReader``, ``fsspec.filesystem("s3", ...)``)."""
        return {"endpoint_url": self.endpoint, **CREDENTIALS, "client_kwargs": {"region_name": "us-east-1"}, **extra}

    def create_bucket(self, name: str) -> str:
        """Creates ``name`` and returns ``s3://<name>``."""
        # call_s3, not mkdir: s3fs would send LocationConstraint=us-east-1, which S3 refuses
        fs = fsspec.filesystem("s3", **self.storage_options(skip_instance_cache=True))
        fs.call_s3("create_bucket", Bucket=name)
        return f"s3://{name}"

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_with(parent_pid: int) -> None:
    """Ends this server when the process that started it is gone (killed by a timeout, say),
    so no server outlives its benchmark or test."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


def main(argv: list[str]) -> None:
    """``HOST PORT [PARENT_PID]``: serves until killed (or until PARENT_PID is gone)."""
    # moto is needed by the server only: imported here, in its own process
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    host, port = argv[0], int(argv[1])
    if len(argv) > 2:
        threading.Thread(target=_exit_with, args=(int(argv[2]),), name="exit-with-parent", daemon=True).start()
    run_simple(host, port, SerialWrites(DomainDispatcherApplication(create_backend_app)), threaded=True)


if __name__ == "__main__":
    main(sys.argv[1:])
