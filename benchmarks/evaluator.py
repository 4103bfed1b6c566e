"""Evaluator performance (SPEC §14, §10.4): bytes read per evaluated checkpoint, and the time from
a commit to the start of its evaluation.

**Bytes read / checkpoint size** (target ≤ 1.0×), for a state of ``--mib`` MiB, two ways:

- *one read* — what the evaluation loop does: `supervisor.checkpoint.load.loader.read_checkpoint`
  (open, checksum while reading, load from memory);
- *verify, then load* — the previous path: ``checkpoints_iterator`` verified the checkpoint
  (``check_checkpoint``: a full checksum read) and the evaluator then loaded it with
  ``load_checkpoint`` (``torch.load`` while a helper thread checksums it again).

Two counters from ``/proc/self/io``: ``rchar`` (bytes returned by read calls, page cache hits
included: the work done) and ``read_bytes`` (bytes fetched from the storage device), the
latter with the checkpoint's pages evicted first (``posix_fadvise(DONTNEED)``; a filesystem
that ignores it shows 0). Each figure is the median of ``--repeats`` rounds, interleaved.

**Commit → evaluation start**: a trainer *process* saves a checkpoint every 0.37 s (out of
phase with the polls; ``max_to_keep=1``) and prints when each was committed (the ctime the
rename into place gave the checkpoint directory); the `EvaluationLoop` in this process records
when it starts reading each checkpoint. Printed as median / max over the evaluated checkpoints,
for ``poll_secs`` 0.05 and 0.5 (the latency is bounded by the poll interval plus the read).

Timings are noisy on a shared machine; the bytes figures are not.

Run: ``python benchmarks/evaluator.py [--mib 64] [--dir PATH] [--quick]``
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager, load_checkpoint
from supervisor.checkpoint.load.loader import read_checkpoint, verify_checkpoint as check_checkpoint
from supervisor.estimator.evaluation import EvaluationLoop

MiB = 1 << 20


def make_state(mib: float) -> TrainingState:
    rows = max(1, int(mib * MiB / (1024 * 4)))
    return TrainingState({"model": torch.nn.Linear(1024, rows, bias=False)})


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def evict(path: str) -> None:
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def checkpoint_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def one_read(path: str) -> None:
    read_checkpoint(path)


def verify_then_load(path: str) -> None:
    check_checkpoint(path)
    load_checkpoint(path)


def measure_bytes(path: str, repeats: int) -> dict[str, tuple[float, float]]:
    """``{method: (rchar ratio, read_bytes ratio)}``, medians over interleaved rounds."""
    size = checkpoint_bytes(path)
    samples: dict[str, list[tuple[float, float]]] = {"one read": [], "verify, then load": []}
    for _ in range(repeats):
        for name, fn in (("one read", one_read), ("verify, then load", verify_then_load)):
            evict(path)
            before = proc_io()
            fn(path)
            after = proc_io()
            samples[name].append(((after["rchar"] - before["rchar"]) / size,
                                  (after["read_bytes"] - before["read_bytes"]) / size))
    return {name: (statistics.median(r for r, _ in s), statistics.median(b for _, b in s))
            for name, s in samples.items()}


# ---------------------------------------------------------------- latency
def trainer(directory: str, mib: float, interval: float, count: int) -> None:
    """The trainer process: one save every ``interval`` s; prints ``commit STEP WALLTIME``."""
    state = make_state(mib)
    with CheckpointManager(directory, max_to_keep=1, save_rng=False) as manager:
        for step in range(1, count + 1):
            started = time.monotonic()
            with torch.no_grad():
                state["model"].weight.fill_(step)
            path = manager.save(step, state, wait=True)
            # The rename into place (the commit) sets the directory's ctime: the commit's time.
            print(f"commit {step} {os.stat(path).st_ctime:.6f} {time.time():.6f}", flush=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def measure_latency(root: str, mib: float, interval: float, count: int, poll_secs: float) -> list[float]:
    directory = tempfile.mkdtemp(dir=root, prefix="latency-")
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--trainer", directory, "--mib", str(mib),
                                "--interval", str(interval), "--count", str(count)],
                               stdout=subprocess.PIPE, text=True)
    try:
        loop = EvaluationLoop(directory, lambda ckpt: None, poll_secs=poll_secs, max_steps=count,
                              timeout=60 + interval * count)
        results = loop.run()
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        shutil.rmtree(directory, ignore_errors=True)
    commits = {int(fields[1]): float(fields[2]) for fields in (line.split() for line in out.splitlines())
               if fields and fields[0] == "commit"}
    return [r.started_wall_time - commits[r.step] for r in results if r.step in commits]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=64, help="state size in MiB (default: %(default)s)")
    parser.add_argument("--dir", default=None, help="directory on the disk under test (default: temp dir)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a small state and few rounds (for the test suite)")
    parser.add_argument("--trainer", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, default=0.37, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=12, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trainer:
        trainer(args.trainer, args.mib, args.interval, args.count)
        return {}
    logging.basicConfig(level=logging.WARNING)
    mib, repeats, count = (4, 2, 5) if args.quick else (args.mib, args.repeats, args.count)
    root = tempfile.mkdtemp(dir=args.dir, prefix="supervisor-evaluator-bench-")
    try:
        with CheckpointManager(os.path.join(root, "bytes"), save_rng=False) as manager:
            path = manager.save(1, make_state(mib), wait=True)
        ratios = measure_bytes(path, repeats)
        latencies = {poll: measure_latency(root, min(mib, 16), args.interval, count, poll) for poll in (0.05, 0.5)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    size = mib * MiB
    print(f"evaluator benchmark: state {size / MiB:.0f} MiB, medians of {repeats} interleaved rounds "
          "(shared machine: timings are noisy, bytes are not)")
    print(f"{'bytes read / checkpoint size':<34}{'rchar':>8}{'read_bytes (cold)':>20}")
    for name, (rchar, read_bytes) in ratios.items():
        target = "  target <= 1.0x: " + ("ok" if rchar <= 1.01 else "MISSES TARGET") if name == "one read" else ""
        print(f"  {name:<32}{rchar:>7.2f}x{read_bytes:>19.2f}x{target}")
    figures = {"one_read_rchar": ratios["one read"][0], "verify_then_load_rchar": ratios["verify, then load"][0]}
    print(f"commit -> evaluation start ({count} checkpoints of {min(mib, 16):.0f} MiB, one every "
          f"{args.interval:g} s, trainer in another process)")
    for poll, values in latencies.items():
        if values:
            median_ms, max_ms = statistics.median(values) * 1e3, max(values) * 1e3
            print(f"  poll_secs={poll:<5g} evaluated {len(values):>2}: median {median_ms:7.1f} ms, max {max_ms:7.1f} ms")
            figures[f"latency_median_poll_{poll:g}"] = statistics.median(values)
        else:
            print(f"  poll_secs={poll:<5g} evaluated nothing")
    return figures


if __name__ == "__main__":
    main()
