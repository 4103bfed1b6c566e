"""The trainer of tests/tiers/test_tier_first_step.py: does a tiered session that resumes from
its local tier run its first step without the object store's client (SPEC §17, issue 33)?

``python tests/tiers/first_step_probe.py LOGDIR LOCAL_DIR --steps N --out OUT.json [--probe]``
(the S3 endpoint in ``S3_ENDPOINT``) trains a small model with ``local_dir`` to step N, a local
save every step, a copy to the logdir every 2. With ``--probe`` the persist worker is held
before it touches the logdir until the first step is done (at most `HOLD_SECS`; a seam of this
script only: `Persister._start_worker` wrapped), so whatever of the client (``s3fs``,
``aiobotocore``, ``botocore``) is imported by then was imported for the first step's sake.
OUT.json gets what was seen: the step restored, the client's modules at the first step, whether
the hold ran out (something waited for the logdir before the first step), the last step.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

CLIENT = ("s3fs", "aiobotocore", "botocore")
HOLD_SECS = 60.0


def hold_the_persist_worker(first_step: threading.Event, seen: dict) -> None:
    from supervisor.checkpoint.tiers import persist

    start = persist.Persister._start_worker

    def held(self):
        seen["hold_ran_out"] = not first_step.wait(HOLD_SECS)
        return start(self)
    persist.Persister._start_worker = held


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("local_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--probe", action="store_true")
    args = parser.parse_args()
    import torch

    import supervisor
    from hooks import StopAtStepHook

    seen: dict = {}
    first_step = threading.Event()
    if args.probe:
        hold_the_persist_worker(first_step, seen)

    class FirstStep(supervisor.Hook):
        def after_create_session(self, session, coord) -> None:
            seen["restored"] = session.global_step

        def after_run(self, run_context, run_values) -> None:
            if not first_step.is_set():
                seen["at_first_step"] = sorted(m for m in sys.modules if m.split(".")[0] in CLIENT)
                first_step.set()

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    options = {"endpoint_url": os.environ["S3_ENDPOINT"], "key": "testing", "secret": "testing"}
    with supervisor.MonitoredTrainingSession(
            args.logdir, model, local_dir=args.local_dir, save_checkpoint_steps=1, persist_every_steps=2,
            hooks=[FirstStep(), StopAtStepHook(last_step=args.steps)], save_summaries_steps=None,
            log_step_count_steps=None, storage_options=options) as session:
        while not session.should_stop():
            session.run(lambda: model.weight.data.add_(1.0))
    seen["last"] = session.global_step
    with open(args.out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
