"""Exact resume with the README's loops, killed for real (SPEC §2 "Exact resume", issue 8).

The trainer (exact_resume_trainer.py) runs the README's loops — the for/else loop over a
shuffled torchdata ``StatefulDataLoader`` (with and without its own ``generator=``, with 0 or 2
worker processes) and the quickstart's ``while``/``next(batches)`` loop — with ``Dropout``, an
LR scheduler and bfloat16 autocast, under `Supervisor` and `MonitoredTrainingSession`. Each
variant is SIGKILLed (the whole process group, workers included) at random points: a random
number of steps after its restore, then a random fraction of a step; the for/else variants
also die right after an epoch-end checkpoint was committed, so the next life resumes from one.
Then the run that completes must end with every tensor of the model, the optimizer, the
scheduler, the data position, the loader generators and the next draw of every global
generator equal (``torch.equal``) to an uninterrupted run's. A clean SIGTERM stop and resume
must too.

12 SIGKILLs in all. Runtime: 23 trainer processes, each forked from the test process's zygote
(tests/zygote.py: torch imported once, not ~3 s per process); the next life is spawned while the
current one trains. ``EXACT_RESUME_SEED`` changes the kill points.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest

from tests import zygote

from .crash_harness import KILLED, LifeResult, assert_same_final_state, check_resumed, inspect_logdir

pytestmark = pytest.mark.slow
pytest.importorskip("torchdata.stateful_dataloader")  # the `test` extra installs it

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exact_resume_trainer.py")
STEPS = 23            # 4.6 epochs of 5 batches: epoch ends at steps 5, 10, 15, 20
SEED = int(os.environ.get("EXACT_RESUME_SEED", "808"))

# name -> (reference key, trainer arguments)
VARIANTS = {
    "supervisor-forelse-shuffle": ("shuffle", ("--front", "supervisor")),
    "mts-forelse-generator": ("generator", ("--front", "mts", "--generator")),
    "mts-forelse-workers2": ("workers2", ("--front", "mts", "--workers", "2")),
    "supervisor-while": ("while", ("--front", "supervisor", "--loop", "while")),
    "mts-while": ("while", ("--front", "mts", "--loop", "while")),
}
REFERENCES = {"shuffle": (), "generator": ("--generator",), "workers2": ("--workers", "2"),
              "while": ("--loop", "while")}


class Trainer:
    """One trainer process in its own process group, spawned warm (it waits for ``go``)."""

    def __init__(self, logdir: str, out: str, log: str, extra: tuple[str, ...]) -> None:
        self.log = log  # ``python -u``, forked from the zygote (tests/zygote.py)
        self.proc = zygote.Forked(TRAINER, [logdir, "--steps", str(STEPS), "--out", out, "--wait-for-go", *extra],
                                  output=log, stdin_pipe=True, new_session=True,
                                  env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))

    def output(self) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _wait_for(self, pattern: str, deadline: float) -> re.Match | None:
        while True:
            match = re.search(pattern, self.output())
            if match or self.proc.poll() is not None:
                return match
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {pattern!r}:\n{self.output()}")
            time.sleep(0.005)

    def run(self, rng: random.Random | None = None, *, sig: int = signal.SIGKILL,
            timeout_secs: float = 120) -> LifeResult:
        """Lets the life train; with ``rng``, sends ``sig`` to the whole process group a random
        1-6 steps after the restore (before the last step), plus a random fraction of a step."""
        deadline = time.monotonic() + timeout_secs
        if not self._wait_for(r"(?m)^ready$", deadline):
            raise AssertionError(f"the trainer never became ready:\n{self.output()}")
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.close()
        if rng is not None:
            start = self._wait_for(r"restored step=(\d+)|initialised from scratch", deadline)
            first = int(start.group(1)) if start and start.group(1) else 0
            target = min(first + rng.randint(1, 6), STEPS - 2)  # never near the run's end
            if target <= first or self._wait_for(rf"(?m)^step {target}$", deadline):
                time.sleep(rng.uniform(0, 0.012))  # the trainer's steps take ~10 ms
                self._signal(sig)
        try:
            returncode = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"the trainer hung:\n{self.output()}") from None
        output = self.output()
        self.close()
        return LifeResult.parse(returncode, output)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Kills what is left of the process group (the trainer, its loader workers) and reaps
        the trainer; idempotent."""
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        if not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass


def _spawn(root, name: str, extra: tuple[str, ...]) -> Trainer:
    return Trainer(str(root / name), str(root / f"{name}.pt"), str(root / f"{name}-{time.monotonic_ns()}.log"),
                   extra)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Final states of uninterrupted runs, one per data configuration (the front door and the
    checkpoint schedule do not change the result)."""
    root = tmp_path_factory.mktemp("reference")
    lives = {key: _spawn(root, key, extra) for key, extra in REFERENCES.items()}
    try:
        for key, life in lives.items():
            result = life.run()
            assert result.returncode == 0 and result.finished_step == STEPS, result.output
            assert "initialised from scratch" in result.output
    finally:
        for life in lives.values():
            life.close()
    return {key: str(root / f"{key}.pt") for key in REFERENCES}


def _lives(tmp_path, extra: tuple[str, ...], plan: list[tuple[tuple[str, ...], dict]]) -> tuple[str, list[LifeResult]]:
    """Runs one life per ``plan`` entry (more trainer arguments, `Trainer.run` keywords), each
    stopped before the end, then one life that must finish; each life is spawned while the
    previous one trains. After every stop, checks that the next life restored the newest
    committed checkpoint."""
    specs = [*plan, ((), {})]
    results: list[LifeResult] = []
    logdir = str(tmp_path / "run")
    upcoming = _spawn(tmp_path, "run", (*extra, *specs[0][0]))
    try:
        for i, (_, run_kwargs) in enumerate(specs):
            life = upcoming
            upcoming = _spawn(tmp_path, "run", (*extra, *specs[i + 1][0])) if i + 1 < len(specs) else None
            before = inspect_logdir(logdir)
            result = life.run(**run_kwargs)
            check_resumed(result, before, None)
            assert "exact resume" not in result.output, result.output  # no inexact-resume warning
            results.append(result)
            if i < len(plan):
                assert result.finished_step is None, f"life {i} should have been stopped:\n{result.output}"
            else:
                assert result.finished_step == STEPS, f"the last life did not finish:\n{result.output}"
    finally:
        if upcoming is not None:
            upcoming.close()
    return str(tmp_path / "run.pt"), results


EPOCH_END = (("--die-after-epoch-save", "1"), {})  # dies right after its first epoch-end commit


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_killed_at_random_points_resumes_bit_exact(variant, references, tmp_path):
    key, extra = VARIANTS[variant]
    rng = random.Random(f"{SEED}-{variant}")
    kill = ((), {"rng": rng})
    kills = 3 if variant == "supervisor-forelse-shuffle" else 2 if "forelse" in variant else 1
    plan = [kill] * kills
    if "forelse" in variant:
        plan.insert(1, EPOCH_END)
    final, results = _lives(tmp_path, extra, plan)
    assert [r.returncode for r in results[:-1]] == [KILLED] * len(plan)
    if "forelse" in variant:
        epoch_end = [i for i, r in enumerate(results) if "killing after the epoch-end checkpoint" in r.output]
        assert epoch_end, "\n\n".join(r.output for r in results)
        assert results[epoch_end[0] + 1].restored_step % 5 == 0  # resumed from the epoch end
    assert_same_final_state(final, references[key])


def test_sigterm_stop_and_resume_is_bit_exact(references, tmp_path):
    """A clean stop (SIGTERM: final checkpoint at the boundary) and a resume."""
    final, results = _lives(tmp_path, ("--front", "supervisor"),
                            [((), {"rng": random.Random(SEED), "sig": signal.SIGTERM})])
    stopped = re.search(r"stopped early at step (\d+)", results[0].output)
    assert results[0].returncode == 0 and stopped, results[0].output
    assert results[1].restored_step == int(stopped.group(1))
    assert_same_final_state(final, references["shuffle"])
