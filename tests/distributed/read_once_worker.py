"""Ranks of the read-once restore tests (issue 31): ``python -m tests.distributed.read_once_worker
SCENARIO ...``, registering into worker.py's scenarios. The models are wide enough that the
checkpoint (a few MiB) dwarfs its manifest and metadata, so the bytes read count what matters."""
from __future__ import annotations

import hashlib
import os
from typing import Any

import torch
import torch.distributed as dist

from tests.distributed.worker import emit, main, scenario


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        h.update(name.encode())
        h.update(full.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _wide(width: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8))


def _step(model: torch.nn.Module, optimizer: Any, step: int, width: int) -> None:
    g = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
    x = torch.randn(4, width, generator=g)
    optimizer.zero_grad()
    (model(x) + 0.01 * torch.randn(4, 8)).pow(2).mean().backward()  # draws from this rank's RNG
    optimizer.step()


@scenario
def read_once(logdir: str, last_step: str, width: str = "512", fmt: str = "ddp", options: str = "") -> None:
    """Trains until ``last_step`` through MonitoredTrainingSession: ``fmt="ddp"`` (a replicated
    ``state.pt`` checkpoint) or ``"fsdp2"`` (``checkpoint_format="dcp"``, sharded). Emits the
    state's digest and this rank's first RNG draw right after the restore. ``options``: the
    ``storage_options`` as JSON, or a JSON list of them, one per rank (e.g. each rank's own
    counting proxy in front of the object store)."""
    import json

    import hooks
    from supervisor import MonitoredTrainingSession

    w = int(width)
    model = _wide(w, seed=0)
    if fmt == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        trained, extra = model, {"checkpoint_format": "dcp"}
    else:
        from torch.nn.parallel import DistributedDataParallel

        trained, extra = DistributedDataParallel(model), {}
    if options:
        chosen = json.loads(options)
        extra["storage_options"] = chosen[dist.get_rank()] if isinstance(chosen, list) else chosen
    optimizer = torch.optim.Adam(trained.parameters(), lr=0.01)
    torch.manual_seed(1000 + dist.get_rank())
    with MonitoredTrainingSession(logdir, model=trained, optimizer=optimizer,
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step))],
                                  save_checkpoint_steps=1000, log_step_count_steps=None, save_summaries_steps=None,
                                  stop_grace_secs=30, max_wait_secs=120, **extra) as s:
        start, digest = s.global_step, _digest(model)
        rng_state = torch.get_rng_state().clone()
        first_draw = torch.rand(2).tolist()
        torch.set_rng_state(rng_state)
        while not s.should_stop():
            s.run(lambda: _step(trained, optimizer, s.global_step, w))
        end = s.global_step
    # the final checkpoint captured the state and this rank's RNG at `end`; nothing drew since
    emit({"start": start, "end": end, "digest": digest, "first_draw": first_draw, "end_digest": _digest(model),
          "next_draw": torch.rand(2).tolist(), "pid": os.getpid()})


@scenario
def shared_bytes(size: str, chunk: str, damaged: str = "no") -> None:
    """The chief shares a private copy of ``size`` random bytes in ``chunk``-byte pieces; every
    other rank receives and checks them against a manifest (a wrong checksum when ``damaged``)."""
    from supervisor.checkpoint.storage.fileio import crc32, format_checksum
    from supervisor.checkpoint.layout.format import FileRecord, Manifest
    from supervisor.checkpoint.load.private_copy import read_private_copy
    from supervisor.checkpoint.load.shared_copy import receive_copy, share_copy

    data = torch.randint(0, 256, (int(size),), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    blob = data.numpy().tobytes()
    checksum = format_checksum(crc32(blob) ^ (1 if damaged == "yes" else 0))
    manifest = Manifest(step=7, wall_time=0.0, torch_version="", world_size=dist.get_world_size(),
                        files={"state.pt": FileRecord(len(blob), checksum)})
    if dist.get_rank() == 0:
        fd = os.memfd_create("source")
        os.write(fd, blob)
        copy = read_private_copy(fd, len(blob), "source")
        os.close(fd)
        share_copy(copy, where="source", chunk_bytes=int(chunk))
        emit({"sent": copy.size})
        return
    got, copy = receive_copy("/ckpt/model.ckpt-7", manifest.to_json(), chunk_bytes=int(chunk))
    with copy.open("received") as f:
        same = f.read() == blob
    emit({"received": copy.size, "same": same, "step": got.step, "memory_file": copy.path is not None})


def _main_nccl() -> None:
    """As worker.main, on NCCL (one GPU per rank: ``LOCAL_RANK``'s)."""
    import sys

    from supervisor import distributed
    from tests.distributed.worker import SCENARIOS

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    distributed.init_process_group("nccl", timeout_secs=120)
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
    distributed.destroy_process_group(timeout_secs=30)


if __name__ == "__main__":
    _main_nccl() if os.environ.get("SUPERVISOR_TEST_BACKEND") == "nccl" else main()
