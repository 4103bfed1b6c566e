"""Exporters: Latest/Best/Final, BestExporter across a restart, torch.export programs, retention,
atomic writes."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from supervisor.estimator import BestExporter, Exporter, FinalExporter, LatestExporter
from supervisor.estimator.exporters import list_exports
from tests import zygote
from tests.estimator.estimator_toy import X, batches, endless, make_estimator


def trained(tmp_path, steps=5, **kwargs):
    est = make_estimator(tmp_path, **kwargs)
    est.train(endless(), max_steps=steps)
    return est


def export_with(exporter, est, loss, final=False):
    result = {"loss": loss, "global_step": est.checkpoint_step()}
    return exporter.export(est, os.path.join(est.model_dir, "export", exporter.name), est.latest_checkpoint(),
                           result, final)


def export_files() -> list[str]:
    """An export without example_input: model.safetensors only with the safetensors extra."""
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return ["eval_result.json", "model.pt"]
    return ["eval_result.json", "model.pt", "model.safetensors"]


def test_export_layout_weights_and_record(tmp_path):
    est = trained(tmp_path)
    path = est.export(tmp_path / "out", eval_result={"loss": 0.5, "global_step": 5})
    assert os.path.dirname(path) == str(tmp_path / "out") and os.path.basename(path).isdigit()
    # no example_input: no program; model.safetensors when the safetensors extra is installed
    assert sorted(os.listdir(path)) == export_files()
    weights = torch.load(os.path.join(path, "model.pt"), weights_only=True)
    ckpt = est.load_model_copy(est.latest_checkpoint())[0].state_dict()
    assert weights.keys() == ckpt.keys() and all(torch.equal(weights[k], ckpt[k]) for k in ckpt)
    record = json.loads(open(os.path.join(path, "eval_result.json")).read())
    assert record == {"global_step": 5, "checkpoint_path": est.latest_checkpoint(), "metrics": {"loss": 0.5}}
    second = est.export(tmp_path / "out")
    assert int(os.path.basename(second)) > int(os.path.basename(path))  # same second: still a new version


def test_safetensors_export_loads_into_a_fresh_model(tmp_path):
    pytest.importorskip("safetensors", exc_type=ImportError, reason="safetensors (the safetensors extra) is not installed")
    from safetensors import safe_open
    from safetensors.torch import load_model

    from tests.estimator.estimator_toy import make_model

    est = trained(tmp_path)
    path = est.export(tmp_path / "out")
    fresh = make_model(seed=1)
    expected = est.load_model_copy(est.latest_checkpoint())[0].state_dict()
    assert not all(torch.equal(fresh.state_dict()[k], expected[k]) for k in expected)
    missing, unexpected = load_model(fresh, os.path.join(path, "model.safetensors"))
    assert not missing and not unexpected
    assert all(torch.equal(fresh.state_dict()[k], expected[k]) for k in expected)
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        assert f.metadata() == {"global_step": "5"}


def test_safetensors_export_stores_tied_weights_once(tmp_path):
    pytest.importorskip("safetensors", exc_type=ImportError, reason="safetensors (the safetensors extra) is not installed")
    from safetensors.torch import load_model

    from supervisor.estimator.export.writer import _save_safetensors

    def tied() -> torch.nn.Module:
        model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
        model[1].weight = model[0].weight  # a language model's tied input and output embeddings
        return model

    torch.manual_seed(0)
    model = tied()
    _save_safetensors(model, str(tmp_path / "m.safetensors"), 3)
    torch.manual_seed(1)
    loaded = tied()
    load_model(loaded, str(tmp_path / "m.safetensors"))
    assert torch.equal(loaded[0].weight, model[0].weight) and loaded[1].weight is loaded[0].weight


def test_torch_export_program_runs_without_the_model_class(tmp_path):
    est = trained(tmp_path, example_input=X[:2])
    path = est.export(tmp_path / "out")
    assert os.path.isfile(os.path.join(path, "model.pt2"))
    probe = X[10:14]
    model = est.load_model_copy(est.latest_checkpoint())[0]
    with torch.no_grad():
        expected = model(probe)
    torch.save(probe, tmp_path / "probe.pt")
    script = ("import sys, torch\n"
              "program = torch.export.load(sys.argv[1])\n"
              "out = program.module()(torch.load(sys.argv[2]))\n"
              "torch.save(out.detach(), sys.argv[3])\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the model's code is not importable
    # (a fresh interpreter: a fork of the zygote would have this checkout on its path)
    subprocess.run([sys.executable, "-c", script, os.path.join(path, "model.pt2"), str(tmp_path / "probe.pt"),
                    str(tmp_path / "out.pt")], check=True, env=env, timeout=300, cwd=tmp_path)
    assert torch.allclose(torch.load(tmp_path / "out.pt"), expected, atol=1e-6)


def test_failed_export_leaves_no_partial_directory(tmp_path):
    est = trained(tmp_path, example_input=torch.zeros(2, 7))  # wrong width: torch.export fails
    with pytest.raises(Exception):
        est.export(tmp_path / "out")
    assert os.listdir(tmp_path / "out") == []


_KILLED_EXPORT = """
import os, signal, sys
from supervisor.estimator import exporters
from supervisor.estimator.export import writer as export_writer
from tests.estimator.estimator_toy import endless, make_estimator

est = make_estimator(sys.argv[1])
est.train(endless(), max_steps=5)
save = export_writer._save_file

def dying_save(path, fill):
    save(path, fill)
    if path.endswith(exporters.WEIGHTS_FILE):  # the weights are written, the record is not
        os.kill(os.getpid(), signal.SIGKILL)

export_writer._save_file = dying_save
est.export(sys.argv[2])
"""


def test_an_export_killed_midway_leaves_only_a_temp_the_next_export_removes(tmp_path):
    out = tmp_path / "out"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    killed = zygote.python(["-c", _KILLED_EXPORT, tmp_path / "model", out], env=env, cwd=repo, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    (left,) = os.listdir(out)
    assert left.startswith(".") and ".tmp-" in left and list_exports(str(out)) == []  # no partial version
    assert os.listdir(out / left) == ["model.pt"]
    # Temps another exporter may still be writing are kept: a live process's, another host's.
    sleeper = subprocess.Popen(["sleep", "120"])  # a live process
    try:
        live = out / f".1.tmp-{socket.gethostname()}-{sleeper.pid}-{'a' * 16}"
        elsewhere = out / f".2.tmp-another-host-{killed_pid()}-{'b' * 16}"
        live.mkdir()
        elsewhere.mkdir()
        est = make_estimator(tmp_path / "model")
        path = est.export(out)
        assert sorted(os.listdir(out)) == sorted([os.path.basename(path), live.name, elsewhere.name])
        assert sorted(os.listdir(path)) == export_files()
    finally:
        sleeper.kill()
        sleeper.wait(timeout=60)


def killed_pid() -> int:
    """The pid of a process that has ended."""
    done = zygote.python(["-c", "import os; print(os.getpid())"], timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_latest_exporter_keeps_exports_to_keep(tmp_path):
    est = trained(tmp_path)
    exporter = LatestExporter("latest", exports_to_keep=2)
    paths = [export_with(exporter, est, 1.0) for _ in range(4)]
    assert [p for _, p in list_exports(tmp_path / "export" / "latest")] == paths[-2:]
    assert not any(n.startswith(".") for n in os.listdir(tmp_path / "export" / "latest"))


def test_final_exporter_exports_only_the_final_evaluation(tmp_path):
    est = trained(tmp_path)
    exporter = FinalExporter("final")
    assert export_with(exporter, est, 1.0, final=False) is None
    assert export_with(exporter, est, 1.0, final=True) is not None


def test_best_exporter_exports_improvements_only(tmp_path):
    est = trained(tmp_path)
    exporter = BestExporter(exports_to_keep=None)
    assert export_with(exporter, est, 0.5) is not None
    assert export_with(exporter, est, 0.7) is None
    assert export_with(exporter, est, 0.4) is not None
    assert len(list_exports(tmp_path / "export" / "best_exporter")) == 2


def test_best_exporter_survives_a_restart(tmp_path):
    est = trained(tmp_path)
    assert export_with(BestExporter(), est, 0.3) is not None
    restarted = BestExporter()  # a new process: learns 0.3 from its export records
    assert export_with(restarted, est, 0.5) is None
    assert export_with(restarted, est, 0.2) is not None


def test_best_exporter_learns_from_eval_events_without_records(tmp_path):
    est = trained(tmp_path)
    est.evaluate(lambda: batches())  # writes the eval events of step 5
    best_loss = est.evaluate(lambda: batches())["loss"]
    est.train(endless(), max_steps=10)
    exporter = BestExporter()
    # step 10's result: worse than the evaluation of step 5 found in the events -> no export
    assert export_with(exporter, est, best_loss + 1.0) is None
    assert export_with(exporter, est, best_loss - 1.0) is not None


def test_best_exporter_compare_fn(tmp_path):
    est = trained(tmp_path)

    def higher_accuracy(best_eval_result, current_eval_result):
        return current_eval_result["accuracy"] > best_eval_result["accuracy"]

    exporter = BestExporter(compare_fn=higher_accuracy)
    path = os.path.join(est.model_dir, "export", exporter.name)
    ckpt = est.latest_checkpoint()
    assert exporter.export(est, path, ckpt, {"accuracy": 0.6, "global_step": 5}, False)
    assert exporter.export(est, path, ckpt, {"accuracy": 0.5, "global_step": 5}, False) is None
    default = BestExporter("by_loss")
    assert default.export(est, path + "_b", ckpt, {"accuracy": 1.0, "global_step": 5}, False)  # first: no best
    with pytest.raises(ValueError, match="no loss in it"):
        default.export(est, path + "_b", ckpt, {"accuracy": 1.0, "global_step": 5}, False)


@pytest.mark.parametrize("factory, error, fragment", [
    (lambda: LatestExporter(""), ValueError, "exporter name must be a non-empty string"),
    (lambda: LatestExporter("x", exports_to_keep=0), ValueError, "`exports_to_keep`, if provided, must be"),
    (lambda: BestExporter(compare_fn=3), TypeError, "compare_fn must be callable"),
    (lambda: BestExporter(compare_fn=lambda a, b: True), ValueError, "must include best_eval_result argument"),
])
def test_exporter_argument_errors(factory, error, fragment):
    with pytest.raises(error, match=fragment):
        factory()


def test_exporter_base_is_abstract(tmp_path):
    with pytest.raises(NotImplementedError):
        Exporter("x").export(None, str(tmp_path), "", {}, False)


def test_best_exporter_reads_the_eval_dir_of_its_eval_spec(tmp_path):
    from supervisor.estimator import EvalSpec
    from supervisor.estimator.training import Evaluator

    est = trained(tmp_path)
    best_loss = est.evaluate(lambda: batches(), name="holdout")["loss"]  # events in eval_holdout only
    est.train(endless(), max_steps=10)
    exporter = BestExporter()
    Evaluator(est, EvalSpec(lambda: batches(), name="holdout", exporters=[exporter]), None)
    assert export_with(exporter, est, best_loss + 1.0) is None  # worse than what eval_holdout holds
