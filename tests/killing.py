"""A training subprocess killed with SIGKILL once a checkpoint reaches a step: the one shape of
the kill-and-resume tests of LoopState, EvaluationHook and MLflowSink."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import supervisor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trainer_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer subprocess: this checkout first on the path, one thread."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1",
            **extra}


def committed_step(logdir: str) -> int:
    """The step of the index's newest checkpoint in ``logdir`` (0 without one)."""
    return int((supervisor.latest_checkpoint(logdir) or "-0").rsplit("-", 1)[1])


def kill_after_checkpoint(args: list[str], logdir: str, *, past_step: int, env: dict[str, str],
                          timeout_secs: float = 120) -> int:
    """Runs ``python *args``, SIGKILLs it once ``logdir`` indexes a checkpoint beyond ``past_step``
    (polled every 5 ms, bounded by ``timeout_secs``); returns the step of the index's checkpoint."""
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + timeout_secs
        while committed_step(logdir) <= past_step:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint past step {past_step} in {logdir} in time: "
                                     f"{proc.communicate()[1] if proc.poll() is not None else 'still running'}")
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    return committed_step(logdir)
