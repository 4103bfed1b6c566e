"""examples/train_and_evaluate.py runs in the suite with tiny counts."""
from __future__ import annotations

import importlib.util
import os

from tests.estimator.estimator_toy import eval_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_example():
    spec = importlib.util.spec_from_file_location("train_and_evaluate_example",
                                                  os.path.join(ROOT, "examples", "train_and_evaluate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_trains_evaluates_exports_the_best_and_stops_early(tmp_path):
    example = load_example()
    # a learning rate that diverges after a few evaluations, so early stopping ends the run
    result = example.main(["--model-dir", str(tmp_path), "--steps", "2000", "--eval-every", "20",
                           "--patience", "60", "--lr", "0.3"])
    metrics = result["metrics"]
    assert result["stopped_early"] and metrics["global_step"] < 2000
    steps = [s for s, _ in eval_scalars(str(tmp_path / "eval"))["loss"]]
    assert steps[0] == 20 and steps[-1] == metrics["global_step"]
    assert result["best_export_accuracy"] > 0.75  # a real classifier of the moons (chance 0.5)
    assert os.path.isfile(os.path.join(result["best_export"], "model.pt"))
