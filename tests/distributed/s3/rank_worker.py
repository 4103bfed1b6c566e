"""One rank of a 2-rank gloo job on an ``s3://`` logdir whose S3 client is configured by
``storage_options=`` only (the test scrubs ``AWS_*`` from the environment):
``python -m tests.distributed.s3.rank_worker s3_resume URL OPTIONS_JSON``. Registers its scenario
into tests/distributed/worker.py's and runs that module's main (process group, RESULT line)."""
from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from tests.distributed.worker import build_ddp, emit, main, make_step, scenario, state_digest


def _session(url: str | None, options: dict | None, last_step: int, *, scramble: bool = False) -> dict:
    """Trains to ``last_step`` through MonitoredTrainingSession (saves every 3 steps on ``url``).
    ``scramble``: weights and RNG unlike any run's, so only a real restore can match."""
    import hooks
    from supervisor import MonitoredTrainingSession

    net, ddp, optimizer = build_ddp()
    if scramble:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(dist.get_rank() + 1)
        torch.manual_seed(4242)
    session_ref: list[Any] = [None]
    with MonitoredTrainingSession(url, model=ddp, optimizer=optimizer, storage_options=options,
                                  hooks=[hooks.StopAtStepHook(last_step=last_step)],
                                  save_checkpoint_steps=3, log_step_count_steps=None, save_summaries_steps=None,
                                  max_wait_secs=60, stop_grace_secs=8) as s:
        session_ref[0] = s
        start = s.global_step
        step = make_step(ddp, optimizer, session_ref)
        while not s.should_stop():
            s.run(step)
        end = s.global_step
    return {"start": start, "end": end, "digest": state_digest(net), "rng": torch.rand(2).tolist()}


@scenario
def s3_resume(url: str, options_json: str, half: str = "6", last: str = "12") -> None:
    """Half a run on ``url``, then an uninterrupted run in memory (the reference), then a run
    resumed from ``url``'s checkpoint: every rank reports each."""
    options = json.loads(options_json)
    first = _session(url, options, int(half))
    reference = _session(None, None, int(last))
    resumed = _session(url, options, int(last), scramble=True)
    emit({"first": first, "reference": reference, "resumed": resumed})


if __name__ == "__main__":
    main()
