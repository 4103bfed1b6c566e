"""What a failed rank costs (SPEC §14, §12): a 2-rank gloo job under torchrun
(``--max-restarts=1``) with checkpoints; rank 1 is SIGKILLed mid-run (``kill``) or frozen with
SIGSTOP (``hang``), and the job recovers by itself (torchrun restarts every rank, every rank
restores the last checkpoint).

Prints the breakdown, from the moment of the signal:
- detection: until rank 0 — the surviving rank — raises (its own error, from its event log) and
  until its process is gone (its pid leaves /proc or turns zombie: polled every 10 ms);
  targets: a killed rank ≤ 5 s; a hung rank ≤ stop_grace_secs + 5 s, with rank 0's error naming
  rank 1 (``rank 1`` in its message);
- restart + restore: until every rank of torchrun's second attempt has run its first step;
- steps lost: rank 1's last step before the signal, the last checkpoint committed by then, and
  the step the second attempt restored: lost = step at the signal - restored step; target: the
  restored step is the last committed checkpoint (no step lost beyond it).

The job (benchmarks/_recovery_trainer.py) runs examples/ddp_torchrun.py's model with a fixed
time per step (``--step-secs``), saves every ``--save-steps`` steps, and logs each rank's events
with their times. ``stop_grace_secs`` (default 5) is the session's.

Run: ``python benchmarks/recovery.py [--scenario kill|hang|both] [--quick]``
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, "benchmarks", "_recovery_trainer.py")


def events(directory: str) -> list[dict[str, Any]]:
    found = []
    for name in os.listdir(directory):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                found += [json.loads(line) for line in f if line.endswith("\n")]
    return sorted(found, key=lambda e: e["t"])


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def committed(logdir: str) -> list[int]:
    return sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(logdir)
                  if n.startswith("model.ckpt-") and n.rsplit("-", 1)[1].isdigit())


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"torchrun ended (status {proc.returncode}) before {what}")
        time.sleep(0.01)
    raise TimeoutError(f"no {what} within {timeout:g} s")


def launch(tmp: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str, str]:
    logdir, events_dir = os.path.join(tmp, "run"), os.path.join(tmp, "events")
    os.makedirs(events_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "--max-restarts=1", "--monitor-interval=0.1", TRAINER, "--logdir", logdir, "--events", events_dir,
               "--steps", str(args.steps), "--save-steps", str(args.save_steps), "--step-secs", str(args.step_secs),
               "--stop-grace-secs", str(args.stop_grace_secs)]
    out = open(os.path.join(tmp, "torchrun.log"), "w")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), logdir, events_dir


def scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one job, signals rank 1 at ``--signal-at`` (its step, first attempt) and measures."""
    sig = signal.SIGKILL if name == "kill" else signal.SIGSTOP
    with tempfile.TemporaryDirectory() as tmp:
        proc, logdir, events_dir = launch(tmp, args)
        try:
            def rank1_at_step() -> dict[str, Any] | None:
                return next((e for e in events(events_dir) if e["rank"] == 1 and e["event"] == "step"
                             and e["attempt"] == 0 and e["step"] >= args.signal_at), None)

            target = wait_for(rank1_at_step, args.timeout, f"rank 1 at step {args.signal_at}", proc)
            os.kill(target["pid"], sig)
            t_signal = time.time()
            saved = committed(logdir)
            before = [e for e in events(events_dir) if e["attempt"] == 0]
            step_at_signal = max(e["step"] for e in before if e["rank"] == 1 and e["event"] == "step")
            rank0 = next(e["pid"] for e in before if e["rank"] == 0)
            wait_for(lambda: gone(rank0), args.timeout, "rank 0's exit", proc)
            t_rank0_gone = time.time()

            def restarted() -> list[dict[str, Any]] | None:
                firsts = {}
                for e in events(events_dir):
                    if e["attempt"] == 1 and e["event"] == "step":
                        firsts.setdefault(e["rank"], e)
                return list(firsts.values()) if len(firsts) == 2 else None

            firsts = wait_for(restarted, args.timeout, "every rank's first step after the restart", proc)
            status = proc.wait(timeout=args.timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        everything = events(events_dir)
        with open(os.path.join(tmp, "torchrun.log")) as f:
            log = f.read()
        if args.log:
            shutil.copy(os.path.join(tmp, "torchrun.log"), f"{args.log}.{name}")
    rank0 = {e["event"]: e for e in reversed(everything) if e["rank"] == 0 and e["attempt"] == 0}
    errors = [rank0[k] for k in ("raised", "error") if k in rank0]
    starts = [e for e in everything if e["attempt"] == 1 and e["event"] == "start"]
    message = errors[0]["error"] if errors else _critical_line(log)
    return {
        "scenario": name, "status": status, "step_at_signal": step_at_signal,
        "committed_at_signal": saved[-1] if saved else None,
        "restored": min(e["step"] for e in starts) if starts else None,
        "detect_error": (errors[0]["t"] - t_signal) if errors else None,
        "phases": {k: rank0[k]["t"] - t_signal for k in PHASES if k in rank0},
        "detect_exit": t_rank0_gone - t_signal, "message": message,
        "sessions_up": (max(e["t"] for e in starts) - t_signal) if len(starts) == 2 else None,
        "first_steps": max(e["t"] for e in firsts) - t_signal, "names_rank": "rank 1" in (message or ""),
        "done": sum(e["event"] == "done" for e in everything if e["attempt"] == 1),
    }


PHASES = {"raised": "the session sees the error (on_exception)",
          "error": "the session is closed, the error leaves it",
          "destroyed": "the process group is destroyed",
          "exit": "the interpreter joined its threads (last atexit)"}


def _critical_line(log: str) -> str | None:
    """Rank 0's last words when its watchdog ended it (os._exit: no event of its own)."""
    lines = [x for x in log.splitlines() if "RankFailureError" in x or "CRITICAL" in x]
    return lines[-1] if lines else None


def report(r: dict[str, Any], stop_grace_secs: float) -> None:
    target = 5.0 if r["scenario"] == "kill" else stop_grace_secs + 5.0
    title = "rank 1 SIGKILLed" if r["scenario"] == "kill" else "rank 1 frozen (SIGSTOP)"
    print(f"{title} after its step {r['step_at_signal']} (torchrun --max-restarts=1, stop_grace_secs="
          f"{stop_grace_secs:g}); times from the signal:")
    verdict = "ok" if r["detect_exit"] <= target else "MISSES TARGET"
    if r["scenario"] == "hang":
        verdict += ", names rank 1" if r["names_rank"] else ", MISSES TARGET: the error does not name rank 1"
    for key, what in PHASES.items():
        at = r["phases"].get(key)
        print(f"  rank 0: {what:<52s} {f'{at:.2f} s' if at is not None else 'not logged'}")
    print(f"  detection: rank 0's process gone {'':<29s} {r['detect_exit']:.2f} s   target <= {target:g} s: {verdict}")
    print(f"    rank 0's error: {(r['message'] or '(none logged)')[:300]}")
    if r["sessions_up"] is not None:
        print(f"  restart: every rank's session restored   {r['sessions_up']:.2f} s")
    print(f"  restart + restore: every rank's first step   {r['first_steps']:.2f} s")
    lost = r["step_at_signal"] - r["restored"] if r["restored"] is not None else None
    ok = r["restored"] is not None and r["committed_at_signal"] is not None \
        and r["restored"] >= r["committed_at_signal"]
    print(f"  steps: at the signal {r['step_at_signal']}, last checkpoint committed by then "
          f"{r['committed_at_signal']}, restored {r['restored']} -> {lost} steps lost; "
          f"{'ok (none beyond the last checkpoint)' if ok else 'MISSES TARGET'}")
    print(f"  job: torchrun status {r['status']}, second attempt finished on {r['done']} of 2 ranks")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("kill", "hang", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="a short job (smoke test)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--signal-at", type=int, default=120, help="rank 1's step at which it is signalled")
    parser.add_argument("--step-secs", type=float, default=0.02)
    parser.add_argument("--stop-grace-secs", type=float, default=5.0)
    parser.add_argument("--log", default=None, help="keep torchrun's output as LOG.kill / LOG.hang")
    parser.add_argument("--timeout", type=float, default=240, help="bound on each wait")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.save_steps, args.signal_at = 40, 10, 15
    results = []
    for name in (("kill", "hang") if args.scenario == "both" else (args.scenario,)):
        results.append(scenario(name, args))
        report(results[-1], args.stop_grace_secs)
        print()
    return results


if __name__ == "__main__":
    main()
