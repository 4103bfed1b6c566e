"""Exporters after a kill or damage (issue 21.6, 21.7, 21.10, 22.23): the best evaluated model ends
up exported, a damaged record never lets a worse model in, and what killed exports leave behind is
removed."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess

import pytest
import torch

from supervisor.estimator import BestExporter, LatestExporter
from supervisor.estimator.exporters import RESULT_FILE, SAFETENSORS_FILE, WEIGHTS_FILE, list_exports
from supervisor.estimator.metrics import EvalEventsFile
from tests import zygote
from tests.estimator.estimator_toy import endless, make_estimator
from tests.estimator.test_exporters import killed_pid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    return zygote.python(["-c", script, *args], env=ENV, cwd=REPO, timeout=300)


def records(export_path) -> list[dict | None]:
    found = []
    for _, path in list_exports(str(export_path)):
        try:
            found.append(json.loads(open(os.path.join(path, RESULT_FILE)).read()))
        except ValueError:
            found.append(None)
    return found


_TRAIN_AND_EVALUATE = """
import os, signal, sys
import torch
from torch import nn
from supervisor.estimator import BestExporter, Estimator, EvalSpec, RunConfig, TrainSpec
from supervisor.estimator import exporters
from supervisor.estimator.export import writer as export_writer
from supervisor.estimator import train_and_evaluate
from tests.estimator.estimator_toy import batches, endless

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 2)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        return self.fc(x)

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def train_step(batch):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
    loss.backward()
    optimizer.step()
    model.steps += 1
    return {"loss": loss}

def eval_step(model, batch):  # every later checkpoint evaluates worse: the first one is the best
    return {"loss": model.steps.clone()}

if sys.argv[2] == "kill":
    save = export_writer._save_file
    def dying_save(path, fill):
        save(path, fill)
        if path.endswith(exporters.WEIGHTS_FILE):  # the first export is half written
            os.kill(os.getpid(), signal.SIGKILL)
    export_writer._save_file = dying_save

config = RunConfig(sys.argv[1], save_checkpoints_steps=5, log_step_count_steps=0, save_summary_steps=0)
est = Estimator(model=model, optimizer=optimizer, train_step=train_step, eval_step=eval_step, config=config)
train_and_evaluate(est, TrainSpec(endless(), max_steps=20),
                   EvalSpec(lambda: batches(), steps=1, throttle_secs=0, exporters=[BestExporter()]))
"""


@pytest.mark.slow
def test_best_exporter_killed_in_its_first_export_still_ends_with_the_best_model(tmp_path):
    model_dir = tmp_path / "model"
    killed = run_script(_TRAIN_AND_EVALUATE, str(model_dir), "kill")
    assert killed.returncode == -9, killed.stderr[-3000:]
    best_dir = model_dir / "export" / "best_exporter"
    assert list_exports(str(best_dir)) == [] and any(".tmp-" in n for n in os.listdir(best_dir))
    rerun = run_script(_TRAIN_AND_EVALUATE, str(model_dir), "run")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    # The evaluation of step 5 (loss 5) is the best; later ones are worse: step 5 is exported.
    assert [(r["global_step"], r["metrics"]["loss"]) for r in records(best_dir)] == [(5, 5.0)]
    (_, path), = list_exports(str(best_dir))
    assert torch.load(os.path.join(path, WEIGHTS_FILE), weights_only=True)["steps"] == 5
    assert sorted(os.listdir(best_dir)) == [os.path.basename(path)]  # the killed export's temp is gone


def export(exporter, est, step: int, loss: float):
    """``exporter`` called as `train_and_evaluate` does after evaluating the checkpoint of ``step``
    (its eval event written first, as `Estimator.evaluate` does)."""
    EvalEventsFile(est.eval_dir()).write({"loss": loss}, step)
    checkpoint = os.path.join(est.model_dir, f"model.ckpt-{step}")
    assert os.path.isdir(checkpoint), os.listdir(est.model_dir)
    return exporter.export(est, os.path.join(est.model_dir, "export", exporter.name), checkpoint,
                           {"loss": loss, "global_step": step}, False)


@pytest.fixture
def est(tmp_path):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=15)  # checkpoints of steps 0, 5, 10, 15
    return est


@pytest.mark.parametrize("safetensors_kept", [True, False], ids=["step-from-safetensors", "no-step"])
def test_a_damaged_export_record_never_lets_a_worse_model_in(est, safetensors_kept):
    first = BestExporter()
    assert export(first, est, 5, 10.0) is not None
    assert export(first, est, 10, 1.0) is not None
    best_dir = os.path.join(est.model_dir, "export", "best_exporter")
    (_, damaged) = list_exports(best_dir)[-1]
    with open(os.path.join(damaged, RESULT_FILE), "w") as f:
        f.write('{"global_step": 10, "metr')  # torn
    if not safetensors_kept:
        os.remove(os.path.join(damaged, SAFETENSORS_FILE))
    restarted = BestExporter()  # a new process: the record of step 10 is unreadable; the events say loss 1
    assert export(restarted, est, 15, 9.0) is None
    assert 15 not in [r["global_step"] for r in records(best_dir) if r is not None]


def test_best_exporter_exports_a_better_evaluation_that_has_no_export(est):
    """An evaluation better than every export (its export was killed): exported at the next call
    from its checkpoint, with its metrics from the events."""
    assert export(BestExporter(), est, 5, 3.0) is not None
    EvalEventsFile(est.eval_dir()).write({"loss": 1.0}, 10)  # evaluated; its export never happened
    best_dir = os.path.join(est.model_dir, "export", "best_exporter")
    assert export(BestExporter(), est, 15, 2.0) is None  # worse than step 10's
    assert [(r["global_step"], r["metrics"]) for r in records(best_dir)] == [(5, {"loss": 3.0}),
                                                                            (10, {"loss": 1.0})]
    (_, newest) = list_exports(best_dir)[-1]
    assert json.loads(open(os.path.join(newest, RESULT_FILE)).read())["checkpoint_path"].endswith("model.ckpt-10")


def test_best_exporter_exports_the_current_one_when_the_best_checkpoint_is_gone(est, caplog):
    """The best evaluation's checkpoint was deleted by retention before it could be exported:
    the bar is what was exported, so the best model still available gets exported."""
    EvalEventsFile(est.eval_dir()).write({"loss": 1.0}, 3)  # no checkpoint of step 3 exists
    best_dir = os.path.join(est.model_dir, "export", "best_exporter")
    assert export(BestExporter(), est, 15, 2.0) is not None
    assert [r["global_step"] for r in records(best_dir)] == [15]
    assert "its checkpoint is gone" in caplog.text


def test_best_exporter_removes_a_killed_exports_temp_even_when_not_exporting(est):
    exporter = BestExporter()
    assert export(exporter, est, 5, 1.0) is not None
    best_dir = os.path.join(est.model_dir, "export", "best_exporter")
    temp = os.path.join(best_dir, f".99.tmp-{socket.gethostname()}-{killed_pid()}-{'c' * 16}")
    os.makedirs(temp)
    assert export(BestExporter(), est, 10, 2.0) is None  # a restart, not better: nothing exported
    assert not os.path.exists(temp)


_KILLED_GC = """
import os, signal, sys
from supervisor.estimator import LatestExporter
from supervisor.estimator.export import base as exporter_base
from tests.estimator.estimator_toy import endless, make_estimator

est = make_estimator(sys.argv[1])
est.train(endless(), max_steps=5)
exporter = LatestExporter("latest", exports_to_keep=1)
path = os.path.join(est.model_dir, "export", "latest")
exporter.export(est, path, est.latest_checkpoint(), {"loss": 1.0, "global_step": 5}, False)
rmtree = exporter_base.shutil.rmtree

def dying_rmtree(target, *args, **kwargs):
    if ".deleting-" in os.path.basename(target):  # the old export is renamed aside, not yet deleted
        os.kill(os.getpid(), signal.SIGKILL)
    return rmtree(target, *args, **kwargs)

exporter_base.shutil.rmtree = dying_rmtree
exporter.export(est, path, est.latest_checkpoint(), {"loss": 1.0, "global_step": 5}, False)
"""


def test_an_export_garbage_collection_killed_midway_is_finished_by_the_next_export(tmp_path):
    killed = run_script(_KILLED_GC, str(tmp_path))
    assert killed.returncode == -9, killed.stderr[-3000:]
    latest = tmp_path / "export" / "latest"
    assert [n for n in os.listdir(latest) if ".deleting-" in n], os.listdir(latest)
    (tmp_path / "export" / "latest" / ".notes").mkdir()  # a user's hidden directory is not a leftover
    est = make_estimator(tmp_path)
    path = LatestExporter("latest", exports_to_keep=1).export(
        est, str(latest), est.latest_checkpoint(), {"loss": 1.0, "global_step": 5}, False)
    assert sorted(os.listdir(latest)) == sorted([".notes", os.path.basename(path)])


def test_every_exported_file_has_the_same_mode(tmp_path):
    est = make_estimator(tmp_path)
    est.train(endless(), max_steps=5)
    path = est.export(tmp_path / "out", eval_result={"loss": 1.0})
    modes = {name: stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) for name in os.listdir(path)}
    umask = os.umask(0)
    os.umask(umask)
    assert set(modes) == {WEIGHTS_FILE, SAFETENSORS_FILE, RESULT_FILE}
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_damaged_checkpoint_of_the_best_evaluation_does_not_stop_the_export(est, caplog):
    assert export(BestExporter(), est, 5, 3.0) is not None
    EvalEventsFile(est.eval_dir()).write({"loss": 1.0}, 10)
    with open(os.path.join(est.model_dir, "model.ckpt-10", "state.pt"), "r+b") as f:
        f.truncate(10)
    best_dir = os.path.join(est.model_dir, "export", "best_exporter")
    assert export(BestExporter(), est, 15, 2.0) is not None  # better than what is exported
    assert [r["global_step"] for r in records(best_dir)] == [5, 15]
    assert "could not export" in caplog.text and "its checkpoint is gone" in caplog.text
