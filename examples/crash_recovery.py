"""Crash recovery: start training, SIGKILL it mid-run, restart, and watch it resume.

The trainer is `quickstart.py` in a child process, checkpointing every half second. Once a
few checkpoints are committed the child is killed with SIGKILL (no cleanup runs at all);
the restarted run picks up the newest committed checkpoint — weights, optimizer, scheduler,
RNG and data position — and continues from that step.

    python examples/crash_recovery.py [--logdir runs/crash_recovery]

It starts from scratch every time: ``--logdir`` and everything in it are DELETED first, so
point it at a directory of its own, never at a run you want to keep.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

import supervisor

QUICKSTART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")


def step_of(checkpoint_path: str | None) -> int:
    return -1 if checkpoint_path is None else int(checkpoint_path.rsplit("-", 1)[1])


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/crash_recovery",
                        help="a directory of its own: DELETED first, then trained in (default: %(default)s)")
    parser.add_argument("--kill-after-step", type=int, default=300,
                        help="kill the trainer once a checkpoint at or past this step is committed")
    parser.add_argument("--extra-steps", type=int, default=200, help="steps the restarted run trains")
    args = parser.parse_args(argv)
    shutil.rmtree(args.logdir, ignore_errors=True)

    trainer = [sys.executable, QUICKSTART, "--logdir", args.logdir, "--save-secs", "0.5"]
    child = subprocess.Popen(trainer + ["--steps", "1000000000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while step_of(supervisor.latest_checkpoint(args.logdir)) < args.kill_after_step:
            if child.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the trainer exited or stalled (exit code {child.poll()})")
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed_at = step_of(supervisor.latest_checkpoint(args.logdir))
    print(f"trainer SIGKILLed; newest committed checkpoint: step {killed_at}")

    target = killed_at + args.extra_steps
    done = subprocess.run(trainer + ["--steps", str(target)], capture_output=True, text=True, check=True)
    print(done.stdout, end="")
    resumed_at = int(done.stdout.split("resuming at step ", 1)[1].split()[0])
    print(f"restart resumed at step {resumed_at} (the newest checkpoint when killed: {killed_at}) "
          f"and trained to {target}")
    return {"killed_at": killed_at, "resumed_at": resumed_at, "target": target}


if __name__ == "__main__":
    main()
