"""The trainer benchmarks/tiers.py starts, SIGKILLs and restarts: ``--mib`` MiB of float32
parameters under `MonitoredTrainingSession`, a step of ``--step-secs`` (a sleep standing for the
accelerator's work, plus an in-place update of one tensor so every checkpoint differs), saving
as ``--mode`` says:

- ``tiered``: every ``--save-steps`` steps to ``--local-dir``, one every ``--persist-steps``
  steps copied to the ``s3://`` logdir (checkpoint tiers);
- ``persistent``: every ``--save-steps`` steps straight to the logdir (async saves);
- ``dcp``: the same with ``checkpoint_format="dcp"`` (DCP shards written by DCP's own writer
  from a staged copy, one process);
- ``local``: every ``--save-steps`` steps to a logdir on the local disk (a plain local restore);
- ``none``: no checkpoint (the baseline step time).

It appends one JSON line per event to ``--events``: ``launched`` (imports done), ``start`` (the
session created, with the step it restored), ``step`` (a step done, with the global step), each
with ``time.time()``. ``--steps`` > 0 stops there (a calibration run); 0 runs until killed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hooks import StopAtStepHook  # noqa: E402
from supervisor import Hook, MonitoredTrainingSession  # noqa: E402

MODES = ("tiered", "persistent", "dcp", "local", "none")


class Events(Hook):
    def __init__(self, path: str) -> None:
        self._file = open(path, "a")

    def write(self, event: str, **fields: object) -> None:
        self._file.write(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")
        self._file.flush()

    def after_create_session(self, session, coord) -> None:
        self.write("start", step=session.global_step)

    def after_run(self, run_context, run_values) -> None:
        self.write("step", step=run_context.session.global_step)


def model_of(mib: int) -> torch.nn.Module:
    module = torch.nn.Module()
    torch.manual_seed(0)
    module.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(256, 1024)) for _ in range(max(1, mib)))
    return module


def session_arguments(args: argparse.Namespace) -> dict:
    common = {"save_checkpoint_steps": args.save_steps, "save_checkpoint_secs": None, "max_to_keep": 2}
    if args.mode == "none":
        return {"save_checkpoint_steps": None, "save_checkpoint_secs": None}
    if args.mode == "local":
        return common
    options = {"endpoint_url": args.endpoint, "key": "testing", "secret": "testing",
               "client_kwargs": {"region_name": "us-east-1"}}
    common["storage_options"] = options
    if args.mode == "dcp":
        return {**common, "checkpoint_format": "dcp"}
    if args.mode == "tiered":
        return {**common, "local_dir": args.local_dir, "persist_every_steps": args.persist_steps,
                "local_max_to_keep": 2}
    return common


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--local-dir", default=None)
    parser.add_argument("--endpoint", default=None, help="the S3 endpoint (the throttling proxy)")
    parser.add_argument("--events", required=True)
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--step-secs", type=float, default=0.1)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--persist-steps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    events = Events(args.events)
    events.write("launched")
    model = model_of(args.mib)
    hooks = [events] + ([StopAtStepHook(last_step=args.steps)] if args.steps else [])
    with MonitoredTrainingSession(args.logdir if args.mode != "none" else None, model, hooks=hooks,
                                  save_summaries_steps=None, log_step_count_steps=None,
                                  **session_arguments(args)) as session:
        while not session.should_stop():
            session.run(step, model, session.global_step, args.step_secs)


def step(model: torch.nn.Module, global_step: int, step_secs: float) -> None:
    with torch.no_grad():
        model.weights[global_step % len(model.weights)].add_(1.0)
    time.sleep(step_secs)


if __name__ == "__main__":
    main()
