"""Runs real multi-process torch.distributed jobs for the tests: N ranks as processes running
``python -m tests.distributed.worker SCENARIO`` (gloo on loopback, a free port, env://), each
job bounded by a timeout; every process is killed and reaped before the helper returns.

Each rank is forked from the test process's zygote (tests/zygote.py: torch, torch.distributed
and DCP imported once), not started as a fresh interpreter: a rank is a separate process with
its own pid, process group, environment, seeds and exit status, as before, minus the ~4 s of CPU
that importing torch and DCP costs a fresh one (the suite starts ~600 ranks on CI's 2 cores).
What a fork shares is the string hash seed (see `zygote._as_a_fresh_interpreter`); the
torchrun tests start fresh interpreters, as torchrun does."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from tests import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    returncode: int | None
    output: str
    elapsed: float

    @property
    def result(self) -> Any:
        """The JSON the worker printed on its ``RESULT `` line (None when there is none)."""
        for line in self.output.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        return None


def env_for(rank: int, world_size: int, port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
               WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    env.update(extra or {})
    return env


def run_job(scenario: str, world_size: int, *args: str, timeout: float = 120.0,
            extra_env: dict[str, str] | None = None, after_rank0_secs: float | None = None,
            module: str = "tests.distributed.worker", agent_store: bool = False,
            store: Any = None) -> list[RankResult]:
    """Runs ``scenario`` on ``world_size`` ranks; returns each rank's exit code and output.
    A rank still running at ``timeout`` — or ``after_rank0_secs`` after rank 0 ended, when
    given (a hung rank, as torchrun would kill it) — is killed (returncode None). ``module``: the
    worker module (one that registers more scenarios into worker.py's and runs its main).
    ``agent_store``: this process hosts the ranks' store, as torchrun's agent does (with env://
    rank 0 hosts it, and the store goes when rank 0 exits). ``store``: that agent store, made by
    the caller (a ``TCPStore`` kept across jobs, as torchrun's agent keeps it across rounds)."""
    port = free_port() if store is None else store.port
    if store is not None:
        extra_env = {**(extra_env or {}), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    elif agent_store:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        extra_env = {**(extra_env or {}), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    start = time.monotonic()
    outputs = tempfile.mkdtemp(prefix="ranks-")
    procs = [zygote.Forked(None, [scenario, *args], module=module, cwd=ROOT, new_session=True,
                               env=env_for(r, world_size, port, extra_env), output=os.path.join(outputs, str(r)))
             for r in range(world_size)]
    results: list[RankResult] = []
    try:
        for r, proc in enumerate(procs):
            remaining = max(0.1, timeout - (time.monotonic() - start))
            if r > 0 and after_rank0_secs is not None:
                remaining = max(0.1, min(remaining, results[0].elapsed + after_rank0_secs - (time.monotonic() - start)))
            out, code = _wait(proc, remaining, hung_if_stopped=r > 0 and after_rank0_secs is not None)
            results.append(RankResult(r, code, out, time.monotonic() - start))
    finally:
        del store  # kept alive until every rank ended
        for proc in procs:
            if proc.poll() is None:
                proc.kill_group()
                proc.wait(60)
        shutil.rmtree(outputs, ignore_errors=True)
    return results


def _wait(proc: zygote.Forked, timeout: float, hung_if_stopped: bool) -> tuple[str, int | None]:
    """``proc``'s output and exit status; None when it is still running at ``timeout`` (killed).
    With ``hung_if_stopped`` (rank 0 has ended) a rank found SIGSTOPped is hung at once: nothing
    resumes it, so waiting out the rest of ``after_rank0_secs`` would only cost time."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=min(0.2, max(0.01, deadline - time.monotonic())))
            return _output(proc), proc.returncode
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline or (hung_if_stopped and _stopped(proc.pid)):
                proc.kill_group()
                proc.wait(60)
                return _output(proc), None


def _output(proc: zygote.Forked) -> str:
    with open(proc.output, encoding="utf-8", errors="replace") as f:
        return f.read()


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (state T in /proc; False where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def describe(results: list[RankResult]) -> str:
    return "\n".join(f"--- rank {r.rank} (exit {r.returncode}, {r.elapsed:.1f} s)\n{r.output[-4000:]}"
                     for r in results)
