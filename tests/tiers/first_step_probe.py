"""The trainer of tests/tiers/test_tier_first_step.py: does a tiered session that resumes from
its local tier run its first step before its persist worker opens the logdir (SPEC §17, issue 33)?

``python tests/tiers/first_step_probe.py LOGDIR LOCAL_DIR --steps N --out OUT.json [--watch MARKER]``
(the S3 endpoint in ``S3_ENDPOINT``) trains a small model with ``local_dir`` to step N, a local
save every step, a copy to the logdir every 2. With ``--watch`` the first step's ``after_run``
first waits (at most `SETTLE_SECS`) until the persist worker settled: it said (DEBUG) that the
logdir's open waits, or it finished opening the logdir (``Persister._open_logdir`` returned);
then it notes which modules of the client (``s3fs``, ``aiobotocore``, ``botocore``) are imported
and creates the file MARKER, so the test's proxy tells the requests made before the first step
ended from those made after. OUT.json gets what was seen: the step restored, the client's modules
at the first step, whether the worker settled in time and began opening before the first step
ended, the last step.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading

CLIENT = ("s3fs", "aiobotocore", "botocore")
SETTLE_SECS = 60.0


def watch_the_persist_worker(settled: threading.Event, first_step: threading.Event, seen: dict) -> None:
    """`settled` is set when the worker says its open waits, or once it opened the logdir."""
    from supervisor.checkpoint.tiers import persist

    class Waits(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "waits to open the logdir" in record.getMessage():
                settled.set()
    log = logging.getLogger(persist.__name__)
    log.setLevel(logging.DEBUG)
    log.addHandler(Waits(logging.DEBUG))
    opened = persist.Persister._open_logdir

    def watched(self):
        seen.setdefault("opening_before_first_step_ended", not first_step.is_set())
        try:
            return opened(self)
        finally:
            settled.set()
    persist.Persister._open_logdir = watched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("local_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--watch", metavar="MARKER")
    args = parser.parse_args()
    import torch

    import supervisor
    from hooks import StopAtStepHook

    seen: dict = {}
    settled, first_step = threading.Event(), threading.Event()
    if args.watch:
        watch_the_persist_worker(settled, first_step, seen)

    class FirstStep(supervisor.Hook):
        def after_create_session(self, session, coord) -> None:
            seen["restored"] = session.global_step

        def after_run(self, run_context, run_values) -> None:
            if args.watch and not first_step.is_set():
                seen["settled"] = settled.wait(SETTLE_SECS)
                seen["at_first_step"] = sorted(m for m in sys.modules if m.split(".")[0] in CLIENT)
                with open(args.watch, "w"):
                    pass
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
