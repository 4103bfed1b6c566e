"""One rank of benchmarks/peers.py: ``python benchmarks/_peers_rank.py --work DIR --out JSON ...``
with ``RANK``/``WORLD_SIZE``/``MASTER_*`` and ``LOCAL_WORLD_SIZE`` set (4 ranks as 2 nodes).

Self-contained (only the runtime's public names and the managers' documented attributes). A
model of ``--mib`` MiB of parameters, each one ``Shard(0)`` over the ranks (DTensor), Adam:

- ``cost``: ``--saves`` sharded saves to the local tier with ``peer_replicas=True`` (persisted
  only at the first, left out): the replication of each save — bytes each rank sent to its
  partner and the seconds of the exchange (`PeerReplicatedCheckpointManager.replicas`), and the
  wall time from the save's commit until every replica arrived; then the same saves without
  replicas, each persisted to a local logdir: the wall time from the commit until the copy was
  sealed there. And the save's own time (to the commit) in both runs.
- ``lost``: ``--kills`` trials per configuration (with and without replicas, the same random
  steps): train to step k saving every ``--save-steps`` steps and persisting every
  ``--persist-steps``; node 1 is lost the moment step k's save committed: what node 0's local_dir
  and the logdir held at that instant is copied aside (replicas and copies then in flight are
  ``.tmp-`` directories, never counted), the run closes, both are put back as they were and node
  1's local_dir removed; every rank restarts and restores: steps lost = k - the restored step.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import time

import torch
import torch.distributed as dist


def _model(mib: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    width = 256 if mib < 4 else 1024
    layers = max(1, round(mib * (1 << 20) / (width * width * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in model:
        module.weight = torch.nn.Parameter(distribute_tensor(module.weight.data, mesh, [Shard(0)]))
    model.mesh, model.width = mesh, width  # type: ignore[assignment]
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    from torch.distributed.tensor import Replicate, distribute_tensor

    g = torch.Generator().manual_seed(step)
    x = distribute_tensor(torch.randn(2, model.width, generator=g), model.mesh, [Replicate()])  # type: ignore[arg-type]
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def _manager(logdir: str, local: str, *, peers: bool, persist_steps: int) -> object:
    from supervisor.checkpoint.tiers.peers import make_sharded_manager

    return make_sharded_manager(logdir, local_dir=local, peer_replicas=peers, persist_every_steps=persist_steps,
                                local_max_to_keep=2, save_mode="sync")


def _node_dir(base: str) -> str:
    return os.path.join(base, f"node{dist.get_rank() // int(os.environ['LOCAL_WORLD_SIZE'])}")


def cost(args: argparse.Namespace, state: object, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    out: dict = {}
    for peers in (True, False):
        base = os.path.join(args.work, f"cost-{peers}")
        manager = _manager(os.path.join(base, "logdir"), _node_dir(base), peers=peers,
                           persist_steps=10 ** 9 if peers else 1)
        manager.open()
        saves, waits = [], []
        for step in range(args.saves + 1):
            _train(model, optimizer, step)
            dist.barrier()
            start = time.perf_counter()
            manager.save(step, state, wait=True)
            committed = time.perf_counter()
            assert manager.wait_replicas(600) if peers else manager._persister.flush(600)  # noqa: SLF001
            dist.barrier()  # every rank's side arrived
            if step:  # step 0 is also persisted (the first always is): left out
                saves.append(committed - start)
                waits.append(time.perf_counter() - committed)
        out["peers" if peers else "logdir"] = {
            "save_s": saves, "after_commit_s": waits,
            "replicas": [list(r) for r in getattr(manager, "replicas", []) if r[0] > 0]}
        manager.close()
    return out


def lost(args: argparse.Namespace, state: object, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    rng = random.Random(args.seed)
    points = [rng.randrange(args.persist_steps, args.steps) for _ in range(args.kills)]
    out: dict = {"points": points}
    for peers in (False, True):
        restored, step_ms = [], []
        for trial, k in enumerate(points):
            base = os.path.join(args.work, f"lost-{peers}-{trial}")
            logdir, local = os.path.join(base, "logdir"), _node_dir(base)
            manager = _manager(logdir, local, peers=peers, persist_steps=args.persist_steps)
            manager.open()
            start = time.perf_counter()
            for step in range(k + 1):  # the replicas of earlier saves run meanwhile, on their thread
                _train(model, optimizer, step)
                if step % args.save_steps == 0:
                    manager.save(step, state, wait=True)
            step_ms.append((time.perf_counter() - start) * 1e3 / (k + 1))
            dist.barrier()  # step k's save committed on every rank: node 1 is lost now
            if dist.get_rank() == 0:  # what node 0 and the logdir hold at this instant (replicas and copies
                _snapshot(base)      # in flight are .tmp- directories: never counted)
            dist.barrier()
            manager.close()
            dist.barrier()
            if dist.get_rank() == 0:
                _lose_node_1(base)
            dist.barrier()
            manager = _manager(logdir, local, peers=peers, persist_steps=args.persist_steps)
            manager.open()
            got = manager.restore(state)
            restored.append(got.global_step if got is not None else -1)
            manager.close(failed=True)
            dist.barrier()
        out["peers" if peers else "logdir"] = [k - r for k, r in zip(points, restored)]
        out[f"step_ms_{'peers' if peers else 'logdir'}"] = step_ms
    return out


def _snapshot(base: str) -> None:
    for name in ("node0", "logdir"):
        try:
            shutil.copytree(os.path.join(base, name), os.path.join(base, f"at-loss-{name}"),
                            ignore=shutil.ignore_patterns("*.tmp-*"))
        except shutil.Error:  # a file removed (retention) while copied: gone at that instant too
            pass


def _lose_node_1(base: str) -> None:
    shutil.rmtree(os.path.join(base, "node1"))
    for name in ("node0", "logdir"):
        shutil.rmtree(os.path.join(base, name))
        os.rename(os.path.join(base, f"at-loss-{name}"), os.path.join(base, name))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mib", type=float, default=8)
    p.add_argument("--saves", type=int, default=10)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--persist-steps", type=int, default=20)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    from supervisor.state import TrainingState

    model, optimizer = _model(args.mib)
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    mine = cost(args, state, model, optimizer)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)  # each rank's figures
    result = {"cost": every, "lost": lost(args, state, model, optimizer)}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
