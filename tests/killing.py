"""A training subprocess killed with SIGKILL once a checkpoint reaches a step: the one shape of
the kill-and-resume tests of LoopState, EvaluationHook and MLflowSink."""
from __future__ import annotations

import os
import tempfile
import time

import supervisor
from tests import zygote

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
    """Runs ``python *args`` (forked from the zygote, tests/zygote.py), SIGKILLs it once ``logdir`` indexes a checkpoint beyond ``past_step``
    (polled every 5 ms, bounded by ``timeout_secs``); returns the step of the index's checkpoint."""
    with tempfile.TemporaryDirectory(prefix="killed-") as scratch:
        stderr = os.path.join(scratch, "stderr")
        proc = zygote.Forked(args[0], args[1:], output=os.devnull, stderr=stderr, env=env)
        try:
            deadline = time.monotonic() + timeout_secs
            while committed_step(logdir) <= past_step:
                if proc.poll() is not None or time.monotonic() > deadline:
                    with open(stderr, encoding="utf-8", errors="replace") as f:
                        said = f.read() if proc.poll() is not None else "still running"
                    raise AssertionError(f"no checkpoint past step {past_step} in {logdir} in time: {said}")
                time.sleep(0.005)
        finally:
            proc.kill()
            proc.wait(60)
    return committed_step(logdir)
