"""A torchrun rank for the evaluator-role tests: the task type (chief/worker) comes from the
torch.distributed rank; prints one JSON line."""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch.distributed as dist  # noqa: E402

from supervisor.estimator import EvalSpec, RunConfig, TrainSpec, train_and_evaluate  # noqa: E402
from tests.estimator.estimator_toy import batches, endless, make_estimator  # noqa: E402


def main() -> None:
    model_dir, max_steps, step_sleep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    dist.init_process_group("gloo")
    try:
        config = RunConfig(model_dir, save_checkpoints_steps=5, log_step_count_steps=0, save_summary_steps=0)
        print(json.dumps({"rank": dist.get_rank(), "task_type": config.task_type, "task_id": config.task_id}),
              flush=True)
        est = make_estimator(model_dir, config=config)

        def slow_batches():
            for batch in endless()():
                time.sleep(step_sleep)
                yield batch

        result = train_and_evaluate(est, TrainSpec(slow_batches, max_steps=max_steps), EvalSpec(lambda: batches()))
        print(json.dumps({"rank": dist.get_rank(), "result": result, "checkpoint_step": est.checkpoint_step()}),
              flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
