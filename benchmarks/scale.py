"""What the distributed runtime costs as the world grows (issue 31): W = 2, 4, 8 (16) gloo ranks
on loopback, today's design (a checkout of it, ``--baseline``) beside this one, in the same run.

Figures, one section (one function) each:

- ``coordination``: per step and per rank — store requests (counted under the runtime's
  ``PrefixStore``), collectives started, and the agreement message's bytes — while
  `CollectiveAgreement.decide` runs once per step with no DDP model to carry it (FSDP2 /
  DTensor / eval steps). Steps last ``--step-secs`` (default 2.2 s: longer than today's
  heartbeat interval, the usual case at scale). A line projects each figure to W = 1,000 from the
  slope measured between the smallest and the largest W. Target: store requests per rank per step
  <= 1 and flat in W.
- ``blame``: one rank SIGKILLed, SIGSTOPped, or raising, at step 5; every survivor's
  `RankFailureError.ranks` is compared with the victim: precision (named ranks that failed / named
  ranks) and recall (survivors that named the victim / survivors), over ``--trials`` trials per kind
  and W (W >= 4; ``--baseline-trials`` for today's design, which is slower to fail), the victim
  drawn at random. Target: 100 %.

Run: ``python benchmarks/scale.py [--quick] [--worlds 2,4,8,16] [--trials 20] [--baseline DIR]``
(``--baseline``: a checkout of today's design, e.g. ``git worktree add /tmp/base <commit>``;
default ``$SUPERVISOR_BASELINE``, e.g. a ``git worktree add /tmp/before 123d13b``; none without it).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._ranks import free_port  # noqa: E402

__all__ = ["FIGURES", "main"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "benchmarks", "_scale_worker.py")
#: The sections, in the order they print (each a function of this module: ``name(args, designs)``).
FIGURES = ("coordination", "blame")
PROJECT_TO = 1000
BLAME_KINDS = ("kill", "stop", "raise")


# ---------------------------------------------------------------- launching ranks
def launch(design_root: str, world_size: int, mode: str, *args: str, timeout: float = 300.0,
           after_first_secs: float = 60.0, ignore: int | None = None) -> list[dict[str, Any] | None]:
    """Runs ``_scale_worker.py MODE ARGS`` on ``world_size`` ranks importing ``supervisor`` from
    ``design_root``; this process hosts their store (as torchrun's agent does, so any rank may die).
    Returns each rank's RESULT (None for a rank that printed none). Once every rank but ``ignore``
    (a victim) has ended, or ``after_first_secs`` after the first ended, or at ``timeout``, the
    ranks still running are killed (a SIGSTOPped victim, a hung survivor)."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    procs = [subprocess.Popen([sys.executable, WORKER, mode, *args], cwd=design_root,
                              env=_env(design_root, rank, world_size, port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for rank in range(world_size)]
    awaited = [p for rank, p in enumerate(procs) if rank != ignore]
    outputs = _collect(procs, awaited, timeout, after_first_secs)
    del store
    return [_result(out) for out in outputs]


def _env(design_root: str, rank: int, world_size: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
               WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1", TORCHELASTIC_USE_AGENT_STORE="True",
               PYTHONPATH=design_root)
    return env


def _collect(procs: list[subprocess.Popen], awaited: list[subprocess.Popen], timeout: float,
             after_first_secs: float) -> list[str]:
    import threading

    outputs = [""] * len(procs)

    def read(i: int) -> None:
        outputs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for reader in readers:
        reader.start()
    start, first = time.monotonic(), None
    try:
        while time.monotonic() < start + timeout:
            ended = sum(p.poll() is not None for p in awaited)
            if ended and first is None:
                first = time.monotonic()
            if ended == len(awaited) or (first is not None and time.monotonic() > first + after_first_secs):
                break
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                _kill(proc)
        for reader in readers:
            reader.join(timeout=30)
    return outputs


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _result(output: str) -> dict[str, Any] | None:
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    from benchmarks._scale_worker import WATCHDOG_NAMES

    match = WATCHDOG_NAMES.search(output)  # a survivor its watchdog ended: it names a rank too
    return {"named": [int(match.group(1))], "watchdog": True} if match else None


# ---------------------------------------------------------------- figure: coordination
def coordination(args: argparse.Namespace, designs: dict[str, str]) -> dict[str, dict[int, dict[str, float]]]:
    """Store requests, collectives and message bytes per step and rank, for each design and W."""
    steps = 2 if args.quick else args.steps
    print(f"\n== coordination: {steps} steps of {args.step_secs:g} s, CollectiveAgreement without DDP, "
          f"stop_grace_secs={args.grace:g}; per step and per rank (median over ranks; setup excluded)")
    print(f"{'design':<8}{'W':>4}{'store req':>12}{'(incl. setup)':>15}{'collectives':>13}{'msg bytes':>11}{'job-wide req':>14}")
    figures: dict[str, dict[int, dict[str, float]]] = {}
    for name, root in designs.items():
        figures[name] = {}
        for world in args.worlds:
            results = launch(root, world, "traffic", str(steps), str(args.step_secs), str(args.grace),
                             timeout=120 + steps * args.step_secs * 2)
            if any(r is None for r in results):
                print(f"{name:<8}{world:>4}  a rank printed no result: {results}")
                continue
            row = _traffic_row(results, steps)
            figures[name][world] = row
            print(f"{name:<8}{world:>4}{row['requests']:>12.2f}{row['with_setup']:>15.2f}{row['collectives']:>13.2f}"
                  f"{row['bytes']:>11.0f}{row['requests'] * world:>14.1f}")
    _projection(figures, "requests", "store requests per rank per step", target=1.0)
    _projection(figures, "bytes", "agreement message bytes per step")
    return figures


def _traffic_row(results: list[dict[str, Any]], steps: int) -> dict[str, float]:
    import statistics

    return {"requests": statistics.median(r["steady_requests"] / steps for r in results),
            "with_setup": statistics.median(r["total_requests"] / steps for r in results),
            "collectives": statistics.median(r["collectives"] / (steps + 1) for r in results),
            "bytes": statistics.median(r["message_bytes"] for r in results)}


def _projection(figures: dict[str, dict[int, dict[str, float]]], key: str, what: str,
                target: float | None = None) -> None:
    """A line per design: ``key`` at W = PROJECT_TO from the slope between the smallest and the
    largest W measured (per rank; job-wide is that times W)."""
    for name, rows in figures.items():
        if len(rows) < 2:
            continue
        low, high = min(rows), max(rows)
        slope = (rows[high][key] - rows[low][key]) / (high - low)
        at = max(0.0, rows[high][key] + slope * (PROJECT_TO - high))  # a noisy negative slope: 0
        verdict = "" if target is None else ("  ok (target <= %g, flat)" % target
                                             if at <= target and abs(slope) * PROJECT_TO <= target else
                                             "  MISSES TARGET (<= %g, flat in W)" % target)
        print(f"projected to W={PROJECT_TO}: {name}: {what} {at:.2f} (slope {slope:+.3f} per rank; "
              f"job-wide {at * PROJECT_TO:,.0f}){verdict}")


# ---------------------------------------------------------------- figure: blame
def blame(args: argparse.Namespace, designs: dict[str, str]) -> dict[str, dict[tuple[int, str], dict[str, float]]]:
    """Precision and recall of `RankFailureError.ranks` over trials of each failure kind."""
    worlds = [4] if args.quick else [w for w in args.worlds if 4 <= w <= args.blame_max_world]
    print(f"\n== blame: one rank SIGKILLed / SIGSTOPped / raising at step 5, trials per kind and W: "
          f"{'1' if args.quick else args.trials} (today's design: {'1' if args.quick else args.baseline_trials}), "
          f"stop_grace_secs={args.grace_blame:g}; over every survivor's error")
    print(f"{'design':<8}{'W':>4}{'kind':>7}{'precision':>11}{'recall':>9}{'exact':>8}{'secs (median)':>15}")
    figures: dict[str, dict[tuple[int, str], dict[str, float]]] = {}
    rng = random.Random(31)
    for name, root in designs.items():
        figures[name] = {}
        trials = 1 if args.quick else (args.trials if name == "this" else args.baseline_trials)
        for world in worlds:
            for kind in BLAME_KINDS[:1] if args.quick else BLAME_KINDS:
                row = _blame_trials(root, world, kind, trials, args.grace_blame, rng)
                figures[name][(world, kind)] = row
                print(f"{name:<8}{world:>4}{kind:>7}{row['precision']:>10.1%}{row['recall']:>9.1%}"
                      f"{row['exact']:>8.1%}{row['secs']:>15.1f}")
                for example in row["misses"][:1]:
                    print(f"{'':<12}e.g. victim {example[0]}, a survivor named {example[1]}: {example[2][:160]}")
    return figures


def _blame_trials(root: str, world: int, kind: str, trials: int, grace: float,
                  rng: random.Random) -> dict[str, Any]:
    import statistics

    named_total = named_right = survivors = found = exact = 0
    secs: list[float] = []
    misses: list[tuple[int, list[int], str]] = []
    for _ in range(trials):
        victim = rng.randrange(world)
        results = launch(root, world, "blame", kind, str(victim), str(grace), timeout=180, after_first_secs=30,
                         ignore=victim)
        for rank, result in enumerate(results):
            if rank == victim:
                continue
            survivors += 1
            named = (result or {}).get("named", [])
            named_total += len(named)
            named_right += named.count(victim)
            found += victim in named
            exact += named == [victim]
            if result and "secs" in result:
                secs.append(result["secs"])
            if named != [victim]:
                misses.append((victim, named, (result or {}).get("error", "no result")))
    return {"precision": named_right / named_total if named_total else 0.0, "recall": found / max(survivors, 1),
            "exact": exact / max(survivors, 1), "secs": statistics.median(secs) if secs else float("nan"),
            "misses": misses}


# ---------------------------------------------------------------- main
def _designs(args: argparse.Namespace) -> dict[str, str]:
    designs = {}
    baseline = args.baseline if args.baseline is not None else os.environ.get("SUPERVISOR_BASELINE", "none")
    if baseline and baseline != "none" and os.path.isdir(os.path.join(baseline, "supervisor")):
        designs["today"] = os.path.abspath(baseline)
    designs["this"] = ROOT
    return designs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W = 2, 4; two steps; one blame trial (a kill at W=4)")
    parser.add_argument("--worlds", default="2,4,8", help="world sizes, comma-separated (16 fits on a quiet machine)")
    parser.add_argument("--steps", type=int, default=5, help="coordination: steps measured per run")
    parser.add_argument("--step-secs", type=float, default=2.2, help="coordination: seconds per step")
    parser.add_argument("--grace", type=float, default=20.0, help="coordination: stop_grace_secs")
    parser.add_argument("--trials", type=int, default=20, help="blame: trials per failure kind and W")
    parser.add_argument("--baseline-trials", type=int, default=5, help="blame: the same, for today's design")
    parser.add_argument("--grace-blame", type=float, default=4.0, help="blame: stop_grace_secs")
    parser.add_argument("--blame-max-world", type=int, default=8, help="blame: the largest W tried")
    parser.add_argument("--baseline", default=None, help="a checkout of today's design ('none': skip it)")
    parser.add_argument("--figures", default=",".join(FIGURES), help="which sections to run")
    args = parser.parse_args(argv)
    args.worlds = [2, 4] if args.quick else sorted(int(w) for w in args.worlds.split(","))
    designs = _designs(args)
    print(f"designs: {designs}")
    out = {}
    for figure in args.figures.split(","):
        out[figure] = globals()[figure](args, designs)
    return out


if __name__ == "__main__":
    main()
