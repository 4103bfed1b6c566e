"""Parent side of the crash tests: start trainer lives, kill them, read what they left on disk.

A *life* is one run of ``crash_trainer.py`` in its own process, forked from the test process's
zygote (tests/zygote.py: torch and the runtime imported once; a fresh interpreter would
pay ~4 s of CPU for them, far more than the training a life does). Lives are still spawned
ahead of time: each one builds its model and optimizer, prints ``ready`` and waits for a ``go``
line on stdin; it opens the logdir only after ``go``, so the next life warms up while the
current one trains and dies.

`inspect_logdir` is the oracle between two lives: every committed checkpoint directory must
verify (sizes and checksums), and the checkpoint the next life must restore is the one the
index names (or, without an index, the highest committed directory) — SPEC §5.4.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import torch

import supervisor
from tests import zygote
from supervisor.checkpoint import verify_checkpoint

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_trainer.py")
KILLED = -signal.SIGKILL
_COMMITTED = re.compile(r"^model\.ckpt-(\d+)$")


class Life:
    """One trainer process, spawned warm (imports done, waiting for ``go``)."""

    def __init__(self, logdir: str, out: str, log: str, *, steps: int, seam: str | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("CRASH_AT", None)
        if seam:
            env["CRASH_AT"] = seam
        self.seam, self.log = seam, log
        env["PYTHONUNBUFFERED"] = "1"  # as ``python -u``: each line reaches the log at once
        self.proc = zygote.Forked(TRAINER, [logdir, "--steps", steps, "--out", out, "--wait-for-go", *extra],
                                      output=log, env=env, stdin_pipe=True)

    def output(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def run(self, *, kill_after_secs: float | None = None, timeout_secs: float = 90) -> LifeResult:
        """Lets the life start training; with ``kill_after_secs`` the parent SIGKILLs it then
        (if its own seam has not already); returns once the process is gone."""
        deadline = time.monotonic() + timeout_secs
        while "ready" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"the trainer never became ready (exit {self.proc.returncode}):\n"
                                     + self.output())
            time.sleep(0.01)
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except BrokenPipeError:  # died meanwhile: its exit status and output say how
            pass
        if kill_after_secs is not None:
            time.sleep(kill_after_secs)
            self.kill()
        try:
            returncode = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"the trainer hung (seam {self.seam}):\n{self.output()}") from None
        return LifeResult.parse(returncode, self.output())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """Kills the process if it still runs and reaps it (every test calls this in finally;
        idempotent)."""
        self.kill()
        try:
            self.proc.wait(timeout=30)
        finally:
            if not self.proc.stdin.closed:
                try:
                    self.proc.stdin.close()
                except BrokenPipeError:
                    pass


@dataclass(frozen=True)
class LifeResult:
    """What one life printed, parsed."""

    returncode: int
    output: str
    restored_step: int | None
    restored_path: str | None
    committed: tuple[int, ...]
    transient_after_open: str | None
    killed_at: str | None
    finished_step: int | None

    @classmethod
    def parse(cls, returncode: int, output: str) -> LifeResult:
        restored = re.search(r"restored step=(\d+) from (\S+)", output)
        transient = re.search(r"transient after open: (\[.*\])", output)
        killed = re.search(r"killing at (\w+)", output)
        finished = re.search(r"finished step=(\d+)", output)
        return cls(returncode, output,
                   int(restored.group(1)) if restored else None,
                   restored.group(2) if restored else None,
                   tuple(int(s) for s in re.findall(r"committed model\.ckpt-(\d+) ", output)),
                   transient.group(1) if transient else None,
                   killed.group(1) if killed else None,
                   int(finished.group(1)) if finished else None)

    @property
    def started(self) -> bool:
        """Whether the session was created (restore or initialisation done)."""
        return self.restored_step is not None or "initialised from scratch" in self.output


@dataclass(frozen=True)
class DiskState:
    """A logdir between two lives.

    Attributes:
        committed: step -> path of every committed checkpoint directory (all verified).
        transient: names of ``*.tmp-*`` / ``*.deleting-*`` entries a crash left.
        index: the parsed index (absolute paths), None when there is none.
        expected: (step, path) the next life must restore, None when it must start fresh.
        names: every entry of the logdir.
    """

    committed: dict[int, str]
    transient: tuple[str, ...]
    index: Any
    expected: tuple[int, str] | None
    names: tuple[str, ...]
    logdir: str

    def path(self, name: str) -> str:
        return os.path.join(self.logdir, name)


def inspect_logdir(logdir: str) -> DiskState:
    """Reads a logdir after a crash and checks the commit protocol's promise: every committed
    checkpoint verifies, and the index (if any) is readable and names a verified one."""
    names = tuple(sorted(os.listdir(logdir))) if os.path.isdir(logdir) else ()
    committed = {}
    for name in names:
        match = _COMMITTED.match(name)
        if match:
            path = os.path.join(logdir, name)
            verify_checkpoint(path)  # raises CheckpointCorruptError naming the reason
            committed[int(match.group(1))] = path
    transient = tuple(n for n in names if ".tmp-" in n or ".deleting-" in n)
    index = supervisor.get_checkpoint_state(logdir)
    assert index is not None or "checkpoint" not in names, "the index exists but is unreadable"
    if index is not None:
        path = os.path.normpath(index.model_checkpoint_path)
        assert os.path.isdir(path), f"the index names {path}, which does not exist; dir: {names}"
        step = verify_checkpoint(path).step
        expected: tuple[int, str] | None = (step, path)
    elif committed:
        step = max(committed)
        expected = (step, committed[step])
    else:
        expected = None
    return DiskState(committed, transient, index, expected, names, logdir)


def check_resumed(result: LifeResult, before: DiskState, newest_published: int | None) -> None:
    """The restart restored exactly the checkpoint the crash left as newest (verified before the
    restart), never older than a commit an earlier life reported, and found no leftovers."""
    assert result.started, f"the life died before creating its session:\n{result.output}"
    if before.expected is None:
        assert "initialised from scratch" in result.output, result.output
        assert newest_published is None
        return
    step, path = before.expected
    assert (result.restored_step, os.path.normpath(result.restored_path or "")) == (step, path), (
        f"restored {result.restored_step} from {result.restored_path}, expected step {step} from {path}:\n"
        + result.output)
    if newest_published is not None:
        assert step >= newest_published, f"restored step {step}, but step {newest_published} had been committed"
    assert result.transient_after_open == "[]", f"leftovers after open: {result.transient_after_open}"


def assert_same_final_state(actual_path: str, expected_path: str) -> None:
    """Weights, optimizer state, data position and the next draw of every generator: equal bit
    for bit (``torch.equal``: same dtype, shape and every bit of every element)."""
    actual = torch.load(actual_path, weights_only=True)
    expected = torch.load(expected_path, weights_only=True)
    mismatches = _differences(actual, expected, "")
    assert not mismatches, "final state differs from the uninterrupted run at: " + ", ".join(mismatches)


def _differences(a: Any, b: Any, where: str) -> list[str]:
    if isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where or "<root>"]
    if isinstance(b, dict):
        if not isinstance(a, dict) or set(a) != set(b):
            return [f"{where} (keys)"]
        return [d for k in b for d in _differences(a[k], b[k], f"{where}.{k}")]
    if isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(b):
            return [f"{where} (length)"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [where]
