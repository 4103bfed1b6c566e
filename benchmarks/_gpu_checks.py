"""The correctness checks of benchmarks/gpu.py, on the benchmark's device: exact resume of a
session with dropout and Adam, the rank agreement on DDP models (2 gloo ranks), and the
overlapped capture's torn-write detection (fingerprints on the device vs the CPU; a held copy)."""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch
from torch import nn

from benchmarks._ranks import run_ranks
from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession, TrainingState, load_checkpoint
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.save.fingerprint import Plan, fingerprints
from supervisor.checkpoint.save.overlap import Copier, StreamCopier, ThreadCopier

STOP_ASKED_AT = 5


def _small(device: torch.device) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.3), nn.Linear(128, 8)).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _train(logdir: str, last_step: int, every: int, device: torch.device) -> dict[str, torch.Tensor]:
    model, optimizer = _small(device)
    torch.manual_seed(1)  # the dropout stream of a fresh run (a resumed one restores its own)

    def step(n: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(n)
        x, y = torch.randn(32, 64, generator=g).to(device), torch.randint(0, 8, (32,), generator=g).to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    with MonitoredTrainingSession(logdir, model, optimizer, hooks=[StopAtStepHook(last_step=last_step)],
                                  handle_signals=False, save_checkpoint_steps=every, save_checkpoint_secs=None,
                                  log_step_count_steps=None, save_summaries_steps=None) as session:
        while not session.should_stop():
            session.run(step, session.global_step)
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def exact_resume(directory: str, device: torch.device, steps: int = 20) -> tuple[bool, str]:
    """An uninterrupted ``steps``-step run vs one stopped (final checkpoint) at ``steps // 2`` and
    resumed in a new session: the same weights, bit for bit."""
    straight = _train(os.path.join(directory, "straight"), steps, steps // 2, device)
    resumed_dir = os.path.join(directory, "resumed")
    _train(resumed_dir, steps // 2, steps // 2, device)
    resumed = _train(resumed_dir, steps, steps // 2, device)
    differing = [k for k in straight if not torch.equal(straight[k], resumed[k])]
    if differing:
        return False, f"differs in {differing}"
    return True, f"{len(straight)} tensors bit-exact after {steps} steps (stopped and resumed at {steps // 2})"


def _ddp_rank(rank: int, port: int, device_type: str, out: Any) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from supervisor.engine.boundary import NO_REQUESTS, Requests
    from supervisor.distributed.agreement import CollectiveAgreement

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method="env://")
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    model = DistributedDataParallel(net, device_ids=[0] if device_type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    agreement = CollectiveAgreement(stop_grace_secs=60, modules=[model])
    stopped_at = None
    for step in range(1, 20):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x = torch.randn(8, 16, generator=g).to(device)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        asked = Requests(stop_reason="rank 1 asks") if rank == 1 and step == STOP_ASKED_AT else NO_REQUESTS
        if agreement.decide(step, asked).stop:
            stopped_at = step
            break
    agreement.close()
    flat = torch.cat([p.detach().flatten() for p in net.parameters()]).cpu()
    both = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(both, flat)
    stops: list[Any] = [None, None]
    dist.all_gather_object(stops, stopped_at)
    if rank == 0:
        out.put((stops, torch.equal(both[0], both[1])))
    dist.barrier()
    dist.destroy_process_group()


def ddp_agreement(device: torch.device) -> tuple[bool, str]:
    """Rank 1 asks for a stop at step 5: both ranks stop at step 6, with equal weights."""
    stops, equal = run_ranks(_ddp_rank, device.type, timeout_secs=300)
    ok = stops == [STOP_ASKED_AT + 1] * 2 and equal
    return ok, (f"rank 1 asked for a stop at step {STOP_ASKED_AT}; ranks stopped at {stops}, "
                f"weights {'equal' if equal else 'DIFFER'} across ranks")


def _fingerprints_agree(device: torch.device) -> list[str]:
    """The dtypes whose fingerprints on ``device`` differ from those of their CPU copies."""
    g = torch.Generator().manual_seed(0)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.int64)
    host = [torch.randn(size, generator=g).to(dtype) for dtype in dtypes for size in (7, 3000, 70000)]
    on_device = [t.to(device) for t in host]
    plan = Plan(on_device)
    ((indices, a),), ((_, b),) = fingerprints(plan, on_device).values(), fingerprints(plan, host).values()
    return sorted({str(host[indices[j]].dtype) for j in (a.cpu() != b).nonzero().flatten().tolist()})


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def overlapped_detection(directory: str, device: torch.device) -> tuple[bool, str]:
    """Fingerprints agree across devices; ``p.data.neg_()`` (an even number of sign flips, which
    a bit-sum misses) landing before a held copy discards that save with a WARNING; the next
    save commits the boundary's state bit for bit."""
    differing = _fingerprints_agree(device)
    gate = threading.Event()
    copier: Copier = StreamCopier(before_copy=lambda: torch.cuda._sleep(100_000_000)) if device.type == "cuda" \
        else ThreadCopier(lambda dst, src: (gate.wait(60), torch._foreach_copy_(dst, src)))
    model, optimizer = _small(device)
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    records = _Records()
    logging.getLogger("supervisor.checkpoint").addHandler(records)
    try:
        with CheckpointManager(directory, capture="overlapped", copier=copier, max_to_keep=None) as manager:
            optimizer.zero_grad()
            model(torch.randn(8, 64, device=device)).sum().backward()
            manager.save(1, state)
            model[0].weight.data.neg_()  # queued before the held copy reads it
            gate.set()
            optimizer.step()
            manager.wait()
            expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            manager.save(2, state)
            optimizer.step()
            manager.wait()
    finally:
        logging.getLogger("supervisor.checkpoint").removeHandler(records)
    discarded = any("discarding the checkpoint of step 1" in m for m in records.messages)
    first = os.path.exists(os.path.join(directory, "model.ckpt-1"))
    saved = load_checkpoint(os.path.join(directory, "model.ckpt-2"))["model"]
    exact = all(torch.equal(saved[k], v) for k, v in expected.items())
    ok = not differing and discarded and not first and exact
    return ok, (f"fingerprints device vs CPU: {'equal' if not differing else f'DIFFER for {differing}'}; a write "
                f"before the held copy: {'discarded with a WARNING' if discarded and not first else 'COMMITTED'}; "
                f"the next save {'is the boundary state bit for bit' if exact else 'DIFFERS from the boundary state'}")
