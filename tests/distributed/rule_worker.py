"""A decision rule (examples/save_on_preemption.py) registered on every rank of a real gloo job.

``python -m tests.distributed.rule_worker SCENARIO ...`` (run through harness.run_job with
``module=``); shares worker.py's registry and ``main``.
"""
from __future__ import annotations

import os
import signal

import torch.distributed as dist

from tests.distributed.worker import build_ddp, emit, main, make_step, scenario


@scenario
def preempted_without_schedule(logdir: str, with_rule: str) -> int:
    """No save schedule; SIGTERM to rank 1 only, during step 5. With the rule registered on every
    rank, the agreed preemption also checkpoints that step."""
    import hooks
    from supervisor import MonitoredTrainingSession

    if with_rule == "yes":
        from examples import save_on_preemption

        save_on_preemption.register()
    net, ddp, optimizer = build_ddp()
    rank = dist.get_rank()
    session_ref: list = [None]
    with MonitoredTrainingSession(logdir, model=ddp, optimizer=optimizer, hooks=[hooks.StopAtStepHook(last_step=30)],
                                  save_checkpoint_steps=None, save_checkpoint_secs=None, log_step_count_steps=None,
                                  save_summaries_steps=None, stop_grace_secs=8) as s:
        session_ref[0] = s
        inner = make_step(ddp, optimizer, session_ref)

        def step() -> dict:
            out = inner()
            if rank == 1 and s.global_step + 1 == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            return out

        while not s.should_stop():
            s.run(step)
        emit({"end": s.global_step, "preempted": s.preempted})
    return 0


if __name__ == "__main__":
    main()
