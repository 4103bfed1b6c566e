"""A trainer or evaluator process for the evaluator-role tests: ``train_and_evaluate`` with the
task type from ``SUPERVISOR_TASK_TYPE``. Prints one JSON line with the result."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import hooks  # noqa: E402
from supervisor.estimator import EvalSpec, RunConfig, TrainSpec, train_and_evaluate  # noqa: E402
from tests.estimator.estimator_toy import batches, make_estimator  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--data-steps", type=int, default=None, help="the trainer's data ends after this many")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--early-stop-steps", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    est = make_estimator(args.model_dir, lr=args.lr,
                         config=RunConfig(args.model_dir, save_checkpoints_steps=5, log_step_count_steps=0,
                                          save_summary_steps=0))
    train_hooks = []
    if args.early_stop_steps:
        train_hooks.append(hooks.stop_if_no_decrease_hook(est, "loss", args.early_stop_steps,
                                                          run_every_secs=None, run_every_steps=1))

    def train_input_fn():
        count = 0
        while args.data_steps is None or count < args.data_steps:
            for batch in batches():
                if args.data_steps is not None and count >= args.data_steps:
                    return
                time.sleep(args.step_sleep)
                count += 1
                yield batch

    metrics, exports = train_and_evaluate(
        est, TrainSpec(train_input_fn, max_steps=args.max_steps, hooks=train_hooks),
        EvalSpec(lambda: batches(), steps=None, start_delay_secs=0, throttle_secs=0))
    print(json.dumps({"role": est.config.task_type, "metrics": metrics,
                      "finished_mark": os.path.exists(os.path.join(args.model_dir, ".supervisor.finished")),
                      "checkpoint_step": est.checkpoint_step()}), flush=True)


if __name__ == "__main__":
    main()
