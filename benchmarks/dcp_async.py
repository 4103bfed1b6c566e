"""How long a ``checkpoint_format="dcp"`` save blocks training: asynchronous vs synchronous.

Two gloo ranks on loopback hold a model of ``--mib`` MiB of float32 parameters, each a DTensor
sharded ``Shard(0)`` over both ranks. In interleaved rounds (the order alternates) every rank:

- **async stall**: ``ShardedCheckpointManager(save_mode="async").save`` — the staging copy into
  reused CPU buffers and the RNG capture, the only part on the training thread (its buffers
  were allocated by a warm-up save); then, untimed for the stall,
- **async save to commit**: until ``wait()`` returns (every rank's shards written, fsynced and
  checksummed, the manifest sealed, renamed, indexed);
- **sync save**: ``save_mode="sync"`` — ``dcp.save`` over the default group and the same commit
  protocol on the training thread: what training paid before saves were asynchronous.

A figure per round is the slower rank's. Printed: median (min–max) over the rounds, and the
stall as a fraction of the synchronous save. The machine is shared: figures are noisy.

Run: ``python benchmarks/dcp_async.py [--mib 128] [--rounds 7] [--quick]`` (spawns its ranks).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._ranks import run_ranks, spread  # noqa: E402

FIGURES = ("async stall", "async save to commit", "sync save")


def _sharded_model(mib: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    module = torch.nn.Module()
    rows = 256  # 256 x 1024 float32 = 1 MiB per tensor
    module.weights = torch.nn.ParameterList(
        torch.nn.Parameter(distribute_tensor(torch.empty(rows, 1024).uniform_(-1, 1), mesh, [Shard(0)]))
        for _ in range(max(1, mib)))
    return module


def _rank_main(rank: int, port: int, mib: int, rounds: int, root: str, out: Any) -> None:
    import torch.distributed as dist

    from supervisor import TrainingState
    from supervisor.checkpoint.sharded import ShardedCheckpointManager

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    state = TrainingState.from_arguments(model=_sharded_model(mib))
    managers = {mode: ShardedCheckpointManager(os.path.join(root, mode), max_to_keep=2, save_mode=mode)
                for mode in ("async", "sync")}
    for manager in managers.values():
        manager.open()
    managers["async"].save(0, state)  # allocates the staging buffers (and the side group)
    managers["async"].wait()
    managers["sync"].save(0, state)
    times: dict[str, list[float]] = {name: [] for name in FIGURES}
    for step in range(1, rounds + 1):
        for mode in (("async", "sync") if step % 2 else ("sync", "async")):
            dist.barrier()
            os.sync()  # no writeback of earlier files in a measured window
            dist.barrier()
            start = time.perf_counter()
            managers[mode].save(step, state)
            elapsed = time.perf_counter() - start
            if mode == "sync":
                times["sync save"].append(elapsed)
                continue
            times["async stall"].append(elapsed)
            managers[mode].wait()
            times["async save to commit"].append(time.perf_counter() - start)
    for manager in managers.values():
        manager.close()
    gathered: list[Any] = [None, None]
    dist.all_gather_object(gathered, times)
    if rank == 0:
        out.put({name: [max(a, b) for a, b in zip(gathered[0][name], gathered[1][name])] for name in FIGURES})
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128, help="model size in MiB (both ranks together)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 2 rounds (a smoke run)")
    args = parser.parse_args(argv)
    mib, rounds = (16, 2) if args.quick else (args.mib, args.rounds)
    root = tempfile.mkdtemp(prefix="dcp-async-bench-")
    try:
        times = run_ranks(_rank_main, mib, rounds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"checkpoint_format='dcp', 2 gloo ranks, {mib} MiB of DTensor (Shard(0)) parameters, "
          f"{rounds} interleaved rounds, seconds as median (min-max) of the slower rank (shared machine: noisy)")
    for name in FIGURES:
        print(f"  {name:<24s} {spread(times[name])}")
    ratios = [a / s for a, s in zip(times["async stall"], times["sync save"])]
    print(f"  {'stall / sync save':<24s} {spread(ratios)}")
    return times


if __name__ == "__main__":
    main()
