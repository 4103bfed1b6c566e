"""Ranks of the sharded tier tests: ``python -m tests.tiers.tier_sharded_worker dcp_tiers LOGDIR
LOCAL LAST_STEP PERSIST_EVERY CRASH [KIND]``, registering into tests/distributed/worker.py's
scenarios. A sharded model (``checkpoint_format="dcp"``) saved every step to the rank's node-local
tier ``LOCAL/node<rank>`` (``LOCAL/node<n>`` with ``NODE=n`` set: a torchrun node), persisted every
PERSIST_EVERY steps. ``CRASH=yes`` ends every rank with ``os._exit`` after the last local commit
and the copies already started, before the final copy a close would make. The RESULT line has
the full model, optimizer and RNG state after the restore and at the end (bit-exact checks)."""
from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from tests.distributed.worker import emit, main, scenario, sharded, train_sharded_step


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the full (gathered) parameters and optimizer state: a collective."""
    h = hashlib.sha256()
    names = {id(p): n for n, p in model.named_parameters()}
    order = [(names.get(id(p), ""), optimizer.state[p]) for g in optimizer.param_groups for p in g["params"]]
    tensors = list(model.state_dict().items()) + [(f"{n}.{k}", v) for n, s in order for k, v in sorted(s.items())]
    for name, tensor in tensors:
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        h.update(name.encode())
        h.update(full.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


@scenario
def dcp_tiers(logdir: str, local: str, last_step: str, persist_every: str, crash: str, kind: str = "dtensor") -> None:
    import hooks
    from supervisor import MonitoredTrainingSession

    model, optimizer = sharded(0, kind)
    torch.manual_seed(1000 + dist.get_rank())  # each rank's own RNG stream (a restore replaces it)
    node = os.environ.get("NODE", str(dist.get_rank()))
    with MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, checkpoint_format="dcp",
                                  local_dir=f"{local}/node{node}", persist_every_steps=int(persist_every),
                                  save_checkpoint_steps=1, hooks=[hooks.StopAtStepHook(last_step=int(last_step))],
                                  log_step_count_steps=None, save_summaries_steps=None, stop_grace_secs=30,
                                  max_wait_secs=120) as s:
        start, start_digest = s.global_step, digest(model, optimizer)
        first_draw = torch.rand(1).item()
        while not s.should_stop():
            s.run(lambda: train_sharded_step(model, optimizer, s.global_step))
        if crash == "yes":
            s.checkpoint_manager.wait()  # the last step's local commit
            s.checkpoint_manager._persister.flush(120)  # the copies already started
            dist.barrier()
            emit({"start": start, "digest": start_digest, "first_draw": first_draw, "end": s.global_step,
                  "end_digest": digest(model, optimizer), "next_draw": torch.rand(1).item()})
            os._exit(0)
        end = s.global_step
    emit({"start": start, "digest": start_digest, "first_draw": first_draw, "end": end,
          "end_digest": digest(model, optimizer), "next_draw": torch.rand(1).item()})


if __name__ == "__main__":
    main()
