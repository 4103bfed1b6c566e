"""What peer replicas cost and what they save (issue 33): ``python benchmarks/peers.py [--mib 8]
[--saves 10] [--steps 40] [--save-steps 2] [--persist-steps 20] [--kills 5]`` (``--quick``: a smoke run).

4 gloo ranks as 2 nodes (``LOCAL_WORLD_SIZE=2``, a local_dir per node) on this machine's loopback,
a model of ``--mib`` MiB of parameters sharded over them (DTensor ``Shard(0)``) with Adam, sharded
saves (``checkpoint_format="dcp"``) to the local tiers (benchmarks/_peers_rank.py):

- the cost of the peer copy per save: bytes each rank sends its partner, the exchange's
  seconds, and the wall time from the commit until every replica arrived — against the copy of
  the same saves to the logdir (a local directory here: a shared filesystem's best case), commit
  to sealed; and the save itself (to the commit) with and without replicas;
- steps lost when node 1 is lost right after a random step (the same steps with and without
  replicas): its local_dir removed, every rank restarted and restored; and the time per training
  step of those runs (a save every ``--save-steps``, the replicas in the background), with and
  without replicas — the cost training sees.

Medians (min-max). Loopback is no network: the exchange's figure is the protocol's cost (reads,
CRC-32, fsync, gloo's copies); a real link adds the part's size over its bandwidth, as the copy
to a remote logdir does.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = os.path.join(ROOT, "benchmarks", "_peers_rank.py")
WORLD = 4


def fresh_interpreter(argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def run(args: argparse.Namespace, spawn: Callable[[list[str], dict[str, str], str], Any], tmp: str) -> dict:
    out, port = os.path.join(tmp, "result.json"), _port()
    argv = [RANK, "--work", tmp, "--out", out, "--mib", str(args.mib), "--saves", str(args.saves), "--steps",
            str(args.steps), "--save-steps", str(args.save_steps), "--persist-steps", str(args.persist_steps),
            "--kills", str(args.kills)]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(spawn(argv, env, os.path.join(tmp, f"rank-{rank}.log")))
    deadline = time.monotonic() + args.timeout
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    if any(p.returncode != 0 for p in procs) or not os.path.exists(out):
        with open(os.path.join(tmp, "rank-0.log")) as f:
            raise RuntimeError(f"the ranks failed ({[p.returncode for p in procs]}):\n{f.read()[-4000:]}")
    with open(out) as f:
        return json.load(f)


def report(args: argparse.Namespace, result: dict) -> dict:
    ranks = result["cost"]
    replicas = [r for rank in ranks for r in rank["peers"]["replicas"]]
    sent = [r[1] for r in replicas]
    exchange = [r[2] * 1e3 for r in replicas]
    peer_wait = [s * 1e3 for rank in ranks for s in rank["peers"]["after_commit_s"]]
    logdir_wait = [s * 1e3 for rank in ranks for s in rank["logdir"]["after_commit_s"]]
    save_peers = [s * 1e3 for rank in ranks for s in rank["peers"]["save_s"]]
    save_plain = [s * 1e3 for rank in ranks for s in rank["logdir"]["save_s"]]
    lost = result["lost"]
    print(f"Peer replicas: {WORLD} gloo ranks as 2 nodes, {args.mib} MiB of parameters (+ Adam), {args.saves} saves")
    print(f"  part per rank sent to its partner per save: {spread([s / 2**20 for s in sent], '{:.2f}')} MiB "
          f"({len(replicas)} replicas)")
    print(f"  {'what':52} ms per save, median (min-max)")
    print(f"  {'peer copy: the exchange (send + receive + commit)':52} {spread(exchange)}")
    print(f"  {'peer copy: commit -> every replica arrived':52} {spread(peer_wait)}")
    print(f"  {'logdir copy (local dir): commit -> sealed':52} {spread(logdir_wait)}")
    print(f"  {'the save to the local tier (to commit), replicas on':52} {spread(save_peers)}")
    print(f"  {'the save to the local tier (to commit), replicas off':52} {spread(save_plain)}")
    print(f"Node 1 lost after steps {lost['points']} (save every {args.save_steps}, persist every "
          f"{args.persist_steps}):")
    print(f"  steps lost without replicas: {spread(lost['logdir'], '{:.0f}')}   values {lost['logdir']}")
    print(f"  steps lost with replicas:    {spread(lost['peers'], '{:.0f}')}   values {lost['peers']}")
    print(f"  ms per training step (a save every {args.save_steps}, rank 0), replicas off: "
          f"{spread(lost['step_ms_logdir'])}; on: {spread(lost['step_ms_peers'])}")
    return {"sent_mib": statistics.median(sent) / 2**20 if sent else 0.0,
            "peer_ms": statistics.median(peer_wait) if peer_wait else 0.0,
            "logdir_ms": statistics.median(logdir_wait) if logdir_wait else 0.0,
            "lost_without": statistics.median(lost["logdir"]), "lost_with": statistics.median(lost["peers"])}


def main(argv: list[str] | None = None, spawn: Callable[[list[str], dict[str, str], str], Any] = fresh_interpreter
         ) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=8)
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--persist-steps", type=int, default=20)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny model, few saves, one loss")
    args = p.parse_args(argv)
    if args.quick:
        args.mib, args.saves, args.steps, args.save_steps, args.persist_steps, args.kills = 0.25, 2, 6, 1, 4, 1
    with tempfile.TemporaryDirectory(prefix="peers-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        return report(args, run(args, spawn, tmp))


if __name__ == "__main__":
    main()
