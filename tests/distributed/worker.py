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
from supervisor.boundary import NO_REQUESTS, Requests

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
            requests = Requests(stop_reason="SIGTERM")
        decision = agreement.decide(step, requests)
        if decision.save or decision.stop:
            decisions.append([step, decision.save, decision.stop, decision.stop_reason])
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


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    name, args = sys.argv[1], sys.argv[2:]
    distributed.init_process_group("gloo", timeout_secs=60)
    try:
        SCENARIOS[name](*args)
    finally:
        if distributed.is_initialized():
            distributed.destroy_process_group(timeout_secs=30)


if __name__ == "__main__":
    main()
