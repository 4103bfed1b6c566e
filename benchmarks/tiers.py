"""What checkpoint tiers buy (SPEC §17, issue 33): training steps lost per failure, wall time to
resume and overhead per step, with the logdir on an ``s3://`` store behind a limited link.

Setup: moto's S3 server on loopback (benchmarks/_s3_server.py) behind a proxy that limits the
link to ``--bandwidth`` MB/s each way (benchmarks/_loopback_proxy.py; loopback is much faster than any
real link to an object store). The trainer (benchmarks/_tiers_trainer.py) holds ``--mib`` MiB of
float32 parameters, runs steps of ``--step-secs`` (a sleep standing for the accelerator's work)
and saves as one of these configurations:

- **tiered**: every ``--save-steps`` steps to a node-local directory (``/dev/shm`` when the machine
  has one, a tmpfs), one every
  ``--persist-steps`` steps copied to the ``s3://`` logdir in the background;
- **persistent-only**: async saves straight to the logdir, every N steps, N chosen so its
  overhead per step matches the tiered run's (calibration below);
- **DCP async**: the runtime's ``checkpoint_format="dcp"`` (DCP's writer, async saves, one
  process) straight to the logdir, its interval chosen the same way;
- **local restore**: plain saves every ``--save-steps`` steps to a logdir in that same node-local
  directory,
  the reference for the resume time.

Calibration: a run of ``--calibration-steps`` steps per configuration and interval (and one with
no checkpoint: the baseline); overhead per step = mean step time - the baseline's. The
persistent-only and DCP intervals are the smallest of ``--save-steps`` x 1, 2, 4... whose
overhead is <= the tiered run's (the largest tried if none is).

Failures: ``--kills`` rounds; in each, every configuration (order alternating) is started (a
resume from its previous life), SIGKILLed at a random step drawn once per round for all (1 to
2 x the largest interval after its first step) and restarted. Per kill: steps lost = the last
step done before the kill - the step the next start restored; resume = process start to the
first step after the restore (of which: session creation, restore and first step after the
imports); the overhead per step of each life (its mean step time - the baseline's: short lives,
noisy, can read below 0). Figures: median (min-max) over the rounds. Targets: steps lost (tiered) <= 1/10 of
persistent-only at equal overhead; resume from the local tier <= 1.0x a plain local restore.

The machine may be shared and small: moto is pure Python and competes with the trainer for the
CPU; figures are noisy, the ratios mean more than the seconds.

Run: ``python benchmarks/tiers.py [--mib 32] [--bandwidth 100] [--kills 5] [--quick]``
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks._ranks import spread  # noqa: E402
from benchmarks._s3_server import S3Server  # noqa: E402
from benchmarks._loopback_proxy import ThrottleProxy  # noqa: E402

TRAINER = os.path.join(ROOT, "benchmarks", "_tiers_trainer.py")
SHM = "/dev/shm"  # the local tier (and the plain local logdir) go there when the machine has it
CONFIGS = ("tiered", "persistent", "dcp", "local")
TITLES = {"tiered": "tiered (local + persist)", "persistent": "persistent-only (s3)",
          "dcp": "DCP async_save (s3)", "local": "plain local restore", "none": "no checkpoint"}


def fresh_interpreter(argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
    """``python ARGV`` in a fresh interpreter, its output into ``log``: what a restarted job
    pays, interpreter start and imports included (the resume times count them)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: str
    endpoint: str
    node: str = ""  # the node-local directories: /dev/shm when there is one (a tmpfs), else tmp
    interval: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    #: How a trainer starts: `fresh_interpreter`; the test's smoke run forks it from its zygote
    #: (tests/zygote.py: imports not paid, figures not asserted) with the same arguments.
    spawn: Callable[[list[str], dict[str, str], str], Any] = fresh_interpreter

    def dirs(self, mode: str, tag: str) -> tuple[str, str]:
        node = self.node or self.tmp
        logdir = os.path.join(node, f"{tag}-{mode}-logdir") if mode in ("local", "none") \
            else f"s3://bench/{tag}-{mode}"
        return logdir, os.path.join(node, f"{tag}-{mode}-node")

    def start(self, mode: str, tag: str, steps: int = 0) -> tuple[subprocess.Popen, str, float]:
        self.runs += 1
        logdir, local_dir = self.dirs(mode, tag)
        events = os.path.join(self.tmp, f"events-{self.runs}.jsonl")
        a = self.args
        command = [TRAINER, "--mode", mode, "--logdir", logdir, "--local-dir", local_dir,
                   "--endpoint", self.endpoint, "--events", events, "--mib", str(a.mib), "--step-secs",
                   str(a.step_secs), "--save-steps", str(self.interval.get(mode, a.save_steps)),
                   "--persist-steps", str(a.persist_steps), "--steps", str(steps)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.time()
        return self.spawn(command, env, os.path.join(self.tmp, f"trainer-{self.runs}.log")), events, t0

    def log_tail(self) -> str:
        with open(os.path.join(self.tmp, f"trainer-{self.runs}.log")) as f:
            return f.read()[-3000:]


def read_events(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def mean_step_time(events: list[dict[str, Any]]) -> float | None:
    """Mean time per step, the first step after the start left out (it pays the restore)."""
    times = [e["t"] for e in events if e["event"] == "step"]
    return (times[-1] - times[1]) / (len(times) - 2) if len(times) > 2 else None


def calibrate_run(bench: Bench, mode: str, tag: str) -> float:
    proc, events, _ = bench.start(mode, tag, steps=bench.args.calibration_steps)
    try:
        status = proc.wait(timeout=bench.args.timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if status != 0:
        raise RuntimeError(f"the {mode} calibration run exited with {status}:\n{bench.log_tail()}")
    return mean_step_time(read_events(events))


def calibrate(bench: Bench) -> dict[str, float]:
    """Step times of the baseline and the tiered run; the persistent-only and DCP intervals."""
    a = bench.args
    step = {"none": calibrate_run(bench, "none", "cal"), "tiered": calibrate_run(bench, "tiered", "cal"),
            "local": calibrate_run(bench, "local", "cal")}
    overhead = {"tiered": step["tiered"] - step["none"]}
    for mode in ("persistent", "dcp"):
        interval = a.save_steps
        while True:
            bench.interval[mode] = interval
            step[mode] = calibrate_run(bench, mode, f"cal{interval}")
            taken = step[mode] - step["none"]
            print(f"  calibration: {TITLES[mode]} every {interval} steps: overhead {taken * 1e3:.1f} ms/step "
                  f"(tiered: {overhead['tiered'] * 1e3:.1f} ms/step)", flush=True)
            if taken <= overhead["tiered"] or interval * 2 > a.calibration_steps // 2:
                break
            interval *= 2
    return step


def kill_life(bench: Bench, mode: str, offset: int | None) -> dict[str, Any]:
    """Starts ``mode`` (a resume), waits for its first step, then SIGKILLs it ``offset`` steps
    later (``offset`` None: at its first step); returns what happened."""
    proc, path, t0 = bench.start(mode, "run")
    try:
        deadline = time.monotonic() + bench.args.timeout
        first = None
        while time.monotonic() < deadline:
            events = read_events(path)
            steps = [e for e in events if e["event"] == "step"]
            if first is None and steps:
                first = steps[0]
            if first is not None and steps[-1]["step"] >= first["step"] + (offset or 0):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the {mode} trainer exited with {proc.returncode}:\n{bench.log_tail()}")
            time.sleep(0.01)
        else:
            raise TimeoutError(f"the {mode} trainer did not reach its kill step in {bench.args.timeout} s")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = read_events(path)
    start = next(e for e in events if e["event"] == "start")
    launched = next(e for e in events if e["event"] == "launched")
    return {"restored": start["step"], "last": max(e["step"] for e in events if e["event"] == "step"),
            "resume": first["t"] - t0, "session": first["t"] - launched["t"],
            "step_time": mean_step_time(events)}


def failures(bench: Bench, modes: tuple[str, ...]) -> dict[str, dict[str, list[float]]]:
    a = bench.args
    rng = random.Random(a.seed)
    span = 2 * max(a.persist_steps, *(bench.interval.get(m, a.save_steps) for m in modes))
    out: dict[str, dict[str, list[float]]] = {m: {"lost": [], "resume": [], "session": [], "step_time": []}
                                              for m in modes}
    previous: dict[str, dict[str, Any]] = {}
    for round_ in range(a.kills + 1):
        offset = rng.randint(1, span) if round_ < a.kills else None
        for mode in (modes if round_ % 2 == 0 else tuple(reversed(modes))):
            life = kill_life(bench, mode, offset)
            if mode in previous:  # this start resumed from the previous life's kill
                out[mode]["lost"].append(previous[mode]["last"] - life["restored"])
                out[mode]["resume"].append(life["resume"])
                out[mode]["session"].append(life["session"])
            if life["step_time"] is not None:
                out[mode]["step_time"].append(life["step_time"])
            previous[mode] = life
        print(f"  round {round_ + 1}/{a.kills + 1} done", flush=True)
    return out


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSES TARGET"


def report(bench: Bench, step: dict[str, float], out: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    a = bench.args
    base = step["none"]
    print(f"\ncheckpoint tiers: {a.mib} MiB of parameters, steps of {a.step_secs:g} s, s3:// on moto behind "
          f"a {a.bandwidth:g} MB/s link, {a.kills} SIGKILLs per configuration at random steps (interleaved "
          f"rounds); median (min-max). Baseline step (no checkpoint): {base * 1e3:.1f} ms")
    print(f"  node-local directories (local tier, plain local logdir): {bench.node or bench.tmp}")
    print(f"  intervals: tiered saves every {a.save_steps} steps locally, persists every {a.persist_steps}; "
          f"persistent-only every {bench.interval['persistent']}; DCP every {bench.interval['dcp']}; "
          f"local every {a.save_steps}")
    print(f"  {'configuration':<28s} {'overhead ms/step (calib.)':>26s} {'overhead ms/step (kills)':>26s} "
          f"{'steps lost per kill':>22s} {'resume s (start->step)':>26s} {'of which session s':>22s}")
    medians: dict[str, dict[str, float]] = {}
    for mode in CONFIGS:
        r = out[mode]
        calib = (step[mode] - base) * 1e3 if mode in step else None
        kills = [(t - base) * 1e3 for t in r["step_time"]]
        medians[mode] = {k: statistics.median(v) for k, v in r.items() if v}
        print(f"  {TITLES[mode]:<28s} {(f'{calib:.1f}' if calib is not None else '-'):>26s} "
              f"{spread(kills, '{:.1f}'):>26s} {spread(r['lost'], '{:.0f}'):>22s} "
              f"{spread(r['resume'], '{:.2f}'):>26s} {spread(r['session'], '{:.2f}'):>22s}")
    lost_t, lost_p = medians["tiered"]["lost"], medians["persistent"]["lost"]
    resume_ratio = medians["tiered"]["resume"] / medians["local"]["resume"]
    session_ratio = medians["tiered"]["session"] / medians["local"]["session"]
    print(f"  target: steps lost, tiered <= 1/10 of persistent-only at equal overhead: {lost_t:.0f} vs "
          f"{lost_p:.0f} ({lost_t / max(lost_p, 1e-9):.2f}x): {verdict(lost_t * 10 <= lost_p)}")
    print(f"  target: resume from the local tier <= 1.0x a plain local restore, process start to first step: "
          f"{resume_ratio:.2f}x: {verdict(resume_ratio <= 1.0)}")
    print(f"  target: the same, session creation + restore + first step only: {session_ratio:.2f}x: "
          f"{verdict(session_ratio <= 1.0)}")
    print(f"  (info) resume from the persistent tier (persistent-only) / local restore: "
          f"{medians['persistent']['resume'] / medians['local']['resume']:.2f}x; DCP: "
          f"{medians['dcp']['resume'] / medians['local']['resume']:.2f}x")
    return {"medians": medians, "lost_ratio": lost_t / max(lost_p, 1e-9), "resume_ratio": resume_ratio,
            "session_ratio": session_ratio}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=32, help="parameters in MiB (the checkpoint's size)")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="the link to the store, MB/s each way")
    parser.add_argument("--step-secs", type=float, default=0.1)
    parser.add_argument("--save-steps", type=int, default=2, help="the tiered (local) and plain local interval")
    parser.add_argument("--persist-steps", type=int, default=40, help="the tiered run's persist interval")
    parser.add_argument("--calibration-steps", type=int, default=80)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="bound on each wait, seconds")
    parser.add_argument("--quick", action="store_true", help="4 MiB, 1 kill, short runs (a smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.step_secs, args.save_steps, args.persist_steps = 4, 0.05, 2, 4
        args.calibration_steps, args.kills = 8, 1
    return args


def main(argv: list[str] | None = None, spawn: Callable[[list[str], dict[str, str], str], Any] = fresh_interpreter
         ) -> dict[str, Any]:
    args = parse(argv)
    tmp = tempfile.mkdtemp(prefix="tiers-bench-")
    node = tempfile.mkdtemp(prefix="tiers-bench-node-", dir=SHM) if os.path.isdir(SHM) else tmp
    try:
        with S3Server() as server, ThrottleProxy(server.port, args.bandwidth * 1e6) as proxy:
            server.create_bucket("bench")
            bench = Bench(args, tmp, proxy.endpoint, node=node, spawn=spawn)
            step = calibrate(bench)
            return report(bench, step, failures(bench, CONFIGS))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(node, ignore_errors=True)


if __name__ == "__main__":
    main()
