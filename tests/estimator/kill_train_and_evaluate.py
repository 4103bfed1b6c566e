"""Child process of test_eval_after_kill.py: local ``train_and_evaluate`` saving every step, with
a LatestExporter (keeping all) and a FinalExporter.

``KILL_AT=eval:N`` SIGKILLs this process in the middle of its N-th evaluation (of the newest
checkpoint: the next step's save is captured only once the evaluation returned, so no later
checkpoint can commit meanwhile); ``KILL_AT=export:N`` at the start of its N-th LatestExporter export
(after that evaluation's events were written); ``KILL_AT=export_step:S`` there when exporting the
checkpoint of step S. Prints ``RESULT <json>`` at a clean end.
"""
from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from supervisor.estimator import (  # noqa: E402
    EvalSpec,
    FinalExporter,
    LatestExporter,
    RunConfig,
    TrainSpec,
    train_and_evaluate,
)
from tests.estimator.estimator_toy import batches, endless, eval_step, make_estimator  # noqa: E402

KIND, _, NUMBER = os.environ.get("KILL_AT", "none:0").partition(":")
COUNTS = {"eval": 0, "export": 0}


def die_at(kind: str) -> None:
    COUNTS[kind] += 1
    if kind == KIND and COUNTS[kind] == int(NUMBER):
        os.kill(os.getpid(), signal.SIGKILL)


class KillingLatestExporter(LatestExporter):
    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        die_at("export")
        if KIND == "export_step" and eval_result["global_step"] == int(NUMBER):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().export(estimator, export_path, checkpoint_path, eval_result, is_the_final_export)


def main() -> None:
    model_dir, max_steps = sys.argv[1], int(sys.argv[2])
    config = RunConfig(model_dir, save_checkpoints_steps=1, log_step_count_steps=0, save_summary_steps=0)
    est = make_estimator(model_dir, config=config, eval_step=eval_step)
    metrics, exports = train_and_evaluate(
        est, TrainSpec(endless(), max_steps=max_steps),
        EvalSpec(eval_input_fn, steps=None, throttle_secs=0,
                 exporters=[KillingLatestExporter("latest", exports_to_keep=None), FinalExporter("final")]))
    print("RESULT " + json.dumps({"metrics": metrics, "exports": list(exports or ())}), flush=True)


def eval_input_fn():
    """One evaluation's batches; the evaluation counter ticks at its third batch (mid-evaluation)."""
    for i, batch in enumerate(batches()):
        if i == 2:
            die_at("eval")
        yield batch


if __name__ == "__main__":
    main()
