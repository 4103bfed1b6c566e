"""Storage bytes read per restore at W = 2, 4, 8 ranks (issue 31 item 2): today's design beside
the read-once one, measured in the same run.

For each world size W and each checkpoint kind — ``ddp`` (a replicated ``state.pt``) and
``fsdp2`` (``checkpoint_format="dcp"``, sharded) — and each side — **today** (the code at
``--baseline DIR``: a checkout of the design before read-once restores, e.g.
``git worktree add /tmp/before 123d13b``) and **read-once** (this checkout) — W gloo ranks on
loopback (`benchmarks._restore_rank`, a tiny wide model, Adam) save a checkpoint at step 2,
then W fresh ranks restore it and run one step. Every rank runs under strace
(`benchmarks._traced_reads`): the bytes it read of the checkpoint's files are counted from
outside the process. Printed per row: the checkpoint's bytes, the bytes read by the restore in
total (and as a multiple of the checkpoint; target ≤ 1.05×) and per rank, and for ``fsdp2``
the shard bytes each save read back; then, per kind and side, a line projecting the total to
W = 1,000 from the slope fitted (least squares) through every W measured.

``main(argv)`` returns the rows (dicts), so ``benchmarks/scale.py`` can import it:
``python -m benchmarks.scale_restore [--worlds 2,4,8] [--width 384] [--baseline /tmp/before]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks._ranks import free_port
from benchmarks._traced_reads import bytes_read, strace_command, strace_works

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = os.path.join(ROOT, "benchmarks", "_restore_rank.py")
TARGET = 1.05
MiB = 1 << 20


def _job(world: int, args: list[str], pythonpath: str, out: str, files: list[str], timeout: float) -> list[dict]:
    """W ranks of `_restore_rank` under strace; per rank, the bytes read per file."""
    port, procs, traces = free_port(), [], []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONPATH=pythonpath)
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        trace = os.path.join(out, f"strace-{rank}.txt")
        traces.append(trace)
        procs.append(subprocess.Popen([*strace_command(trace, files), sys.executable, RANK, *args], cwd=out, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    try:
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    failed = [(r, p.returncode, o[-2000:]) for r, (p, o) in enumerate(zip(procs, outputs)) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"a rank failed: {failed[0]}")
    return [bytes_read(t) for t in traces]


def _under(per_file: dict[str, int], root: str) -> dict[str, int]:
    root = os.path.realpath(root) + os.sep
    return {p: n for p, n in per_file.items() if p.startswith(root)}


def measure(world: int, kind: str, side: str, pythonpath: str, work: str, width: int) -> dict:
    """One row: a save at step 2, then a restore of it, both traced."""
    out = os.path.join(work, f"{side}-{kind}-{world}")
    logdir = os.path.join(out, "run")
    os.makedirs(logdir)
    saved = _job(world, [logdir, "2", str(width), kind], pythonpath, out, [], timeout=600)
    read_back = [sum(n for p, n in _under(f, logdir).items() if p.endswith(".distcp")) for f in saved]
    path = os.path.join(logdir, "model.ckpt-2")
    files = sorted(os.path.realpath(os.path.join(path, f)) for f in os.listdir(path))
    size = sum(os.path.getsize(f) for f in files)
    restored = _job(world, [logdir, "3", str(width), kind], pythonpath, out, files, timeout=600)
    per_rank = [sum(f.values()) for f in restored]
    shutil.rmtree(out, ignore_errors=True)
    return {"world": world, "kind": kind, "side": side, "checkpoint_bytes": size, "restore_bytes": sum(per_rank),
            "per_rank": per_rank, "ratio": sum(per_rank) / size, "save_read_back": read_back}


def _print(rows: list[dict]) -> None:
    print(f"{'W':>3} {'kind':6} {'side':10} {'ckpt MiB':>8} {'read MiB':>9} {'x ckpt':>7}  "
          f"per rank (MiB)  [save: shard bytes read back per rank]")
    for r in rows:
        per = " ".join(f"{n / MiB:.2f}" for n in r["per_rank"])
        back = " ".join(f"{n / MiB:.2f}" for n in r["save_read_back"])
        verdict = "ok" if r["ratio"] <= TARGET else "MISSES TARGET"
        print(f"{r['world']:>3} {r['kind']:6} {r['side']:10} {r['checkpoint_bytes'] / MiB:8.2f} "
              f"{r['restore_bytes'] / MiB:9.2f} {r['ratio']:6.2f}x  {per}  [{back}]  {verdict}")
    for kind in sorted({r["kind"] for r in rows}):
        for side in ("today", "read-once"):
            mine = sorted((r for r in rows if r["kind"] == kind and r["side"] == side), key=lambda r: r["world"])
            if len(mine) < 2:
                continue
            slope, at_1000 = _fit([r["world"] for r in mine], [r["ratio"] for r in mine], 1000)
            chief = max(r["per_rank"][0] / r["checkpoint_bytes"] for r in mine)
            print(f"projection {kind:6} {side:10}: {slope:+.5f}x per rank -> {at_1000:.1f}x the checkpoint read "
                  f"per restore at W=1,000 (chief reads {chief:.2f}x)")


def _fit(xs: list[float], ys: list[float], at: float) -> tuple[float, float]:
    """The least-squares line through ``(xs, ys)``: its slope and its value at ``at``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my + slope * (at - mx)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", default="2,4,8", help="world sizes, comma-separated")
    parser.add_argument("--kinds", default="ddp,fsdp2")
    parser.add_argument("--width", type=int, default=1024,
                        help="the model's width (checkpoint ~ 12*width^2 bytes: weights and Adam's two moments)")
    parser.add_argument("--baseline", default="", help="a checkout of the design before read-once restores "
                        "(e.g. `git worktree add /tmp/before 123d13b`); none by default")
    parser.add_argument("--dir", default=None, help="where the logdirs go (default: a temp dir)")
    args = parser.parse_args(argv)
    if not strace_works():
        raise SystemExit("strace cannot trace a child here (no ptrace): the bytes read cannot be counted")
    sides = [("read-once", ROOT)] + ([("today", args.baseline)] if args.baseline else [])
    work = tempfile.mkdtemp(dir=args.dir, prefix="scale-restore-")
    rows = []
    try:
        for world in [int(w) for w in args.worlds.split(",")]:
            for kind in args.kinds.split(","):
                for side, pythonpath in sides:
                    rows.append(measure(world, kind, side, pythonpath + os.pathsep + ROOT, work, args.width))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print(rows)
    return rows


if __name__ == "__main__":
    main()
