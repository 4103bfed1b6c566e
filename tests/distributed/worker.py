"""One rank of a test job (see harness.py): ``python -m tests.distributed.worker SCENARIO ...``.

Each scenario prints ``RESULT <json>`` on success; failures exit non-zero with a traceback.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from supervisor import distributed
from supervisor.engine.boundary import NO_REQUESTS, Requests

SCENARIOS: dict[str, Callable[..., Any]] = {}


def scenario(fn: Callable[..., Any]) -> Callable[..., Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


def emit(value: Any) -> None:
    print("RESULT " + json.dumps(value), flush=True)


# ---------------------------------------------------------------- the agreement alone
@scenario
def agreement_requests(steps: str = "12") -> None:
    """Rank 1 asks for a save during step 3 and a stop during step 7; rank 0 asks for nothing.
    Every rank records the decisions it applies."""
    from supervisor.distributed.agreement import CollectiveAgreement

    agreement = CollectiveAgreement(stop_grace_secs=30)
    rank = dist.get_rank()
    decisions = []
    for step in range(1, int(steps) + 1):
        requests = NO_REQUESTS
        if rank == 1 and step == 3:
            requests = Requests(save_reasons=("timer",))
        if rank == 1 and step == 7:
            requests = Requests(stop_reason="SIGTERM", preempted=True)
        decision = agreement.decide(step, requests)
        if decision.save or decision.stop:
            decisions.append([step, decision.save, decision.stop, decision.stop_reason, decision.preempted])
        if decision.stop:
            break
    agreement.close()
    emit({"decisions": decisions, "collectives": agreement.collectives})


@scenario
def agreement_last_step(last_step: str = "5") -> None:
    """Every rank's StopAtStepHook-style stop at ``last_step``: applied at once, at that step."""
    from supervisor.distributed.agreement import CollectiveAgreement

    agreement = CollectiveAgreement(stop_grace_secs=30)
    for step in range(1, 100):
        requests = Requests(stop_reason="last_step", stop_on_every_rank=True) if step == int(last_step) else NO_REQUESTS
        decision = agreement.decide(step, requests)
        if decision.stop:
            break
    agreement.close()
    emit({"stopped_at": step})


@scenario
def agreement_failure(mode: str, grace: str = "4") -> None:
    """Rank 1 fails at step 5 (``raise``, ``kill`` or ``hang``); the others must stop in bounded
    time with an error naming rank 1."""
    from supervisor.distributed.agreement import CollectiveAgreement
    from supervisor.distributed.failure import RankFailureError

    agreement = CollectiveAgreement(stop_grace_secs=float(grace))
    rank = dist.get_rank()
    start = None
    try:
        for step in range(1, 1000):
            if rank == 1 and step == 5:
                if mode == "raise":
                    error = ValueError("boom on rank 1")
                    agreement.close(error)
                    raise error
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if mode == "hang":
                    time.sleep(3600)
            if step == 5:
                start = time.monotonic()
            agreement.decide(step, NO_REQUESTS)
            time.sleep(0.01)
    except RankFailureError as e:
        emit({"error": str(e), "ranks": list(e.ranks), "step": e.step,
              "secs_after_failure": time.monotonic() - start})
        os._exit(0)  # a gloo group with a dead peer cannot be destroyed cleanly


@scenario
def agreement_failure_after_the_stop(last_step: str = "4") -> None:
    """Every rank stops at ``last_step`` (agreed); then rank 1 dies while rank 0 is in a
    collective of its own (what a sharded session's final save is). Rank 0 reports the failure."""
    from supervisor.distributed.agreement import CollectiveAgreement

    agreement = CollectiveAgreement(stop_grace_secs=3)
    for step in range(1, 100):
        requests = Requests(stop_reason="last_step", stop_on_every_rank=True) if step == int(last_step) else NO_REQUESTS
        if agreement.decide(step, requests).stop:
            break
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.barrier()
        dist.barrier()
    except Exception as e:  # noqa: BLE001 - the collective that failed because rank 1 died
        error = agreement.report_failure(e)
        emit({"error": str(error), "step": getattr(error, "step", None), "stopped_at": step})
        os._exit(0)  # a gloo group with a dead peer cannot be destroyed cleanly
    emit({"error": None, "stopped_at": step})


# ---------------------------------------------------------------- DDP through a front door
class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.drop = torch.nn.Dropout(0.3)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def state_digest(module: torch.nn.Module) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_ddp() -> tuple[torch.nn.Module, Any, Any]:
    from torch.nn.parallel import DistributedDataParallel

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same initial weights on every rank
    net = Net()
    ddp = DistributedDataParallel(net)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1000 + dist.get_rank())  # each rank its own dropout stream
    return net, ddp, optimizer


def make_step(ddp: torch.nn.Module, optimizer: Any, session_ref: list) -> Callable[[], dict]:
    def step() -> dict:
        s = session_ref[0]
        g = torch.Generator().manual_seed(10_000 * dist.get_rank() + s.global_step)
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 2, (4,), generator=g)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}
    return step


@scenario
def ddp_session(logdir: str, last_step: str, chief_delay: str = "0", max_wait: str = "60",
                fault: str = "none", fault_rank: str = "1", fault_step: str = "0", save_secs: str = "0") -> None:
    emit(_ddp_session(logdir, last_step, chief_delay, max_wait, fault, fault_rank, fault_step, save_secs))


#: ``chief_delay`` of `_ddp_session`: the chief enters its session only once a worker gave up
#: waiting for it (the worker's TimeoutError writes LOGDIR.gave-up).
CHIEF_AFTER_GIVING_UP = "after-a-worker-gave-up"


def _wait_for_file(path: str, what: str, timeout_secs: float = 120) -> None:
    deadline = time.monotonic() + timeout_secs
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} ({path} missing after {timeout_secs:g} s)")
        time.sleep(0.01)


def _ddp_session(logdir: str, last_step: str, chief_delay: str = "0", max_wait: str = "60",
                 fault: str = "none", fault_rank: str = "1", fault_step: str = "0", save_secs: str = "0") -> dict:
    """Trains a DDP model through MonitoredTrainingSession until ``last_step``. On rank
    ``fault_rank``, during step ``fault_step``: ``stop`` (request_stop), ``sigterm``, ``nan`` (a
    NaN loss, NanTensorHook(fail_on_nan_loss=False)), ``raise``, ``kill`` (SIGKILL) or ``hang``.
    ``chief_delay``: ``"0"``, or `CHIEF_AFTER_GIVING_UP` (the chief comes once a worker gave up)."""
    import hooks
    from supervisor import MonitoredTrainingSession

    net, ddp, optimizer = build_ddp()
    rank = dist.get_rank()
    if rank == 0 and chief_delay == CHIEF_AFTER_GIVING_UP:
        _wait_for_file(logdir + ".gave-up", "the worker never gave up waiting for the chief")
    faulty = rank == int(fault_rank)
    user_hooks: list[Any] = [hooks.StopAtStepHook(last_step=int(last_step)),
                             hooks.NanTensorHook("loss", fail_on_nan_loss=False)]
    session_ref: list = [None]
    saves = {"save_checkpoint_secs": float(save_secs)} if float(save_secs) else {"save_checkpoint_steps": 3}
    try:
        session = MonitoredTrainingSession(logdir, model=ddp, optimizer=optimizer, hooks=user_hooks,
                                           log_step_count_steps=None, save_summaries_steps=None,
                                           max_wait_secs=float(max_wait), stop_grace_secs=8, **saves)
    except TimeoutError:
        open(logdir + ".gave-up", "w").close()  # the chief's handshake (CHIEF_AFTER_GIVING_UP)
        raise
    with session as s:
        session_ref[0] = s
        start_step = s.global_step
        inner = make_step(ddp, optimizer, session_ref)

        def step() -> dict:
            out = inner()
            if faulty and s.global_step + 1 == int(fault_step):  # during step fault_step
                if fault == "stop":
                    s.request_stop(reason=f"stop on rank {rank} only")
                elif fault == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                elif fault == "nan":
                    out = {"loss": torch.tensor(float("nan"))}
                elif fault == "raise":
                    raise ValueError(f"boom on rank {rank}")
                elif fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif fault == "hang":
                    time.sleep(3600)
            if float(save_secs):
                time.sleep(0.02)
            return out

        while not s.should_stop():
            s.run(step)
        end_step = s.global_step
    return {"start": start_step, "end": end_step, "digest": state_digest(net),
            "rng": torch.rand(2).tolist(), "stop_reason": s.stop_reason, "preempted": s.preempted}


@scenario
def ddp_preempted(logdir: str) -> int:
    """SIGTERM to rank 1 only, during step 5; every rank follows the README's preemption
    pattern: exit 143 when the session says it was preempted."""
    result = _ddp_session(logdir, "30", fault="sigterm", fault_step="5")
    emit(result)
    return 143 if result["preempted"] else 0


class Counter:
    """A stateful user object in the training state (not a tensor)."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


@scenario
def init_fn_ranks(logdir: str, fail: str = "no") -> None:
    """An ``init_fn`` that draws from this rank's own RNG (a randomised or file-reading
    initialisation): only the chief may run it, and every rank must start from its result."""
    from supervisor import MonitoredTrainingSession

    net, ddp, optimizer = build_ddp()
    rank = dist.get_rank()
    counter = Counter()
    calls = []

    def init_fn(session: Any) -> None:
        calls.append(rank)
        if fail == "yes":
            raise OSError(f"cannot read the warm-start file on rank {rank}")
        g = torch.Generator().manual_seed(5000 + rank)  # a per-rank draw: would split the ranks
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        counter.value = int(torch.randint(0, 1_000_000, (1,), generator=g))

    with MonitoredTrainingSession(logdir, model=ddp, optimizer=optimizer, state={"counter": counter},
                                  init_fn=init_fn, log_step_count_steps=None, save_summaries_steps=None,
                                  save_checkpoint_steps=None, save_checkpoint_secs=None,
                                  max_wait_secs=60, stop_grace_secs=8) as s:
        start = {"digest": state_digest(net), "counter": counter.value}
        session_ref: list = [s]
        step = make_step(ddp, optimizer, session_ref)
        for _ in range(3):
            s.run(step)
    emit({"calls": calls, "start": start, "end": state_digest(net), "counter": counter.value})


@scenario
def ddp_faults(root: str) -> None:
    """Three sessions in turn, each with a stop requested during step 5 on rank 1 only:
    ``request_stop``, SIGTERM, a NaN loss. One job: process start-up is the expensive part."""
    results = {}
    for fault in ("stop", "sigterm", "nan"):
        results[fault] = _ddp_session(os.path.join(root, fault), "30", fault=fault, fault_step="5")
    emit(results)


@scenario
def supervisor_session(logdir: str) -> None:
    """The Supervisor front door on DDP: time-based saves and summaries on the chief; rank 1
    asks for a stop during step 12."""
    import hooks
    from supervisor import Supervisor

    net, ddp, optimizer = build_ddp()
    rank = dist.get_rank()
    sv = Supervisor(logdir, model=ddp, optimizer=optimizer, hooks=[hooks.StopAtStepHook(last_step=200)],
                    save_model_secs=0.2, save_summaries_secs=0.2, stop_grace_secs=8, max_wait_secs=60)
    session_ref: list = [None]
    with sv.managed_session() as s:
        session_ref[0] = s
        inner = make_step(ddp, optimizer, session_ref)

        def step() -> dict:
            out = inner()
            if rank == 1 and s.global_step + 1 == 12:
                s.request_stop(reason="rank 1 asked")
            time.sleep(0.02)
            return out

        while not s.should_stop():
            s.run(step)
        end = s.global_step
    emit({"end": end, "digest": state_digest(net), "stop_reason": s.stop_reason})


# ---------------------------------------------------------------- sharded (DCP) checkpoints
def plain_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 6))


def full_state(module: torch.nn.Module) -> dict[str, list]:
    out = {}
    for name, tensor in module.state_dict().items():
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        out[name] = full.detach().flatten().tolist()
    return out


def sharded(seed: int, kind: str) -> tuple[torch.nn.Module, Any]:
    """The model with DTensor parameters sharded over every rank (``kind``: "dtensor" — each
    parameter ``Shard(0)`` — or "fsdp2": ``fully_shard``), and an Adam optimizer."""
    from torch.distributed.device_mesh import init_device_mesh

    model = plain_model(seed)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.tensor import Shard, distribute_tensor

        for module in model:
            for pname, param in list(module.named_parameters(recurse=False)):
                setattr(module, pname, torch.nn.Parameter(distribute_tensor(param.data, mesh, [Shard(0)])))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train_sharded(model: torch.nn.Module, optimizer: Any, steps: int) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(5, 6, generator=g)
        weight = next(model.parameters())
        if hasattr(weight, "device_mesh") and not hasattr(model, "unshard"):  # plain DTensor params
            from torch.distributed.tensor import Replicate, distribute_tensor

            x = distribute_tensor(x, weight.device_mesh, [Replicate()])
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()


@scenario
def dcp_save(logdir: str, kind: str = "dtensor", step: str = "3") -> None:
    from supervisor import TrainingState
    from supervisor.checkpoint import CheckpointManager
    from supervisor.checkpoint.sharded import save_sharded

    model, optimizer = sharded(0, kind)
    train_sharded(model, optimizer, int(step))
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    manager = CheckpointManager(logdir) if dist.get_rank() == 0 else None
    if manager is not None:
        manager.open()
    try:
        path = save_sharded(logdir, "model.ckpt", int(step), state, wall_time=time.time(),
                            publish=manager.publish if manager is not None else None)
    finally:
        if manager is not None:
            manager.close()
    emit({"path": path, "full": full_state(model), "rng": torch.rand(2).tolist()})


@scenario
def dcp_restore(logdir: str, kind: str = "dtensor") -> None:
    from supervisor import TrainingState
    from supervisor.checkpoint.sharded import choose_checkpoint, restore_sharded

    model, optimizer = sharded(7, kind)  # different initial values: all must come from the checkpoint
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    box = [choose_checkpoint(logdir, "model.ckpt") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    path, step = box[0]
    restored = restore_sharded(path, state, step=step)
    before = full_state(model)
    train_sharded(model, optimizer, 1)  # the optimizer state came back too: training goes on
    emit({"path": restored.path, "step": restored.global_step, "full": before,
          "after_one_more": full_state(model), "rng": torch.rand(2).tolist()})


@scenario
def dcp_session(logdir: str, last_step: str, kind: str = "fsdp2") -> None:
    """A sharded model through MonitoredTrainingSession(checkpoint_format="dcp") until ``last_step``."""
    import hooks
    from supervisor import MonitoredTrainingSession

    model, optimizer = sharded(0, kind)
    kill_at = int(os.environ.get("SUPERVISOR_TEST_KILL_SEAL_AT", "-1"))
    if kill_at >= 0 and dist.get_rank() == 0:  # the chief dies after sealing, before the rename
        from supervisor.checkpoint.save import temp

        seal = temp.TempCheckpoint.seal

        def dying_seal(self: Any, *, step: int, **kwargs: Any) -> Any:
            manifest = seal(self, step=step, **kwargs)
            if step == kill_at:
                print(f"killing the chief while committing step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return manifest

        temp.TempCheckpoint.seal = dying_seal  # type: ignore[method-assign]
    torch.manual_seed(1000 + dist.get_rank())  # each rank's own RNG stream (a restore replaces it)
    with MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, checkpoint_format="dcp",
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step))],
                                  save_checkpoint_steps=2, log_step_count_steps=None,
                                  save_summaries_steps=None, stop_grace_secs=20, max_wait_secs=60) as s:
        start = s.global_step
        first_draw = torch.rand(1).item()  # after the restore: continues the saved stream
        while not s.should_stop():
            s.run(lambda: train_sharded_step(model, optimizer, s.global_step))
        end = s.global_step
    # The final checkpoint captured this rank's RNG at `end`; nothing drew since.
    emit({"start": start, "end": end, "full": full_state(model), "first_draw": first_draw,
          "next_draw": torch.rand(1).item()})


def train_sharded_step(model: torch.nn.Module, optimizer: Any, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(5, 6, generator=g)
    weight = next(model.parameters())
    if hasattr(weight, "device_mesh") and not hasattr(model, "unshard"):
        from torch.distributed.tensor import Replicate, distribute_tensor

        x = distribute_tensor(x, weight.device_mesh, [Replicate()])
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    name, args = sys.argv[1], sys.argv[2:]
    # SUPERVISOR_TEST_PG_TIMEOUT: the training group's (gloo's transport) timeout, e.g. shorter
    # than stop_grace_secs so that it fires before the runtime's own watchdog
    distributed.init_process_group("gloo", timeout_secs=float(os.environ.get("SUPERVISOR_TEST_PG_TIMEOUT", "60")))
    try:
        code = SCENARIOS[name](*args)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # a failed rank leaves at once (as under torchrun); no barrier with the others
    distributed.destroy_process_group(timeout_secs=30)
    sys.exit(code or 0)  # a scenario may return an exit status (the README's preemption pattern)


if __name__ == "__main__":
    main()
