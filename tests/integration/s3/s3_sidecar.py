"""The sidecar evaluator of the torchrun acceptance test (test_torchrun_s3.py): follows the
``s3://`` logdir given (the client configured by the ``AWS_*`` environment, as a user's would
be), evaluates each checkpoint of examples/ddp_torchrun.py's model once, prints each step, and
exits when the trainer marks the run finished.

    python tests/integration/s3/s3_sidecar.py s3://bucket/run
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torch  # noqa: E402

from examples.ddp_torchrun import Net, batch  # noqa: E402
from supervisor.estimator.sidecar import SidecarEvaluator  # noqa: E402


def eval_step(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    x, y = data
    return {"loss": torch.nn.functional.cross_entropy(model(x), y)}


def main() -> None:
    torch.set_num_threads(1)
    evaluator = SidecarEvaluator(Net(), [batch(7, i) for i in range(2)], sys.argv[1], eval_step=eval_step,
                                 poll_secs=0.2, timeout=300)
    for result in evaluator.evaluations():
        print(f"evaluated step {result.step}", flush=True)
    print(f"sidecar stopped: {evaluator.stop_reason}", flush=True)


if __name__ == "__main__":
    main()
