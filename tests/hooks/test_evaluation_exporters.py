"""`EvaluationHook(exporters=[...])` (issue 34 item 1): the exporters of `train_and_evaluate`
called after each in-loop evaluation, exporting the very model evaluated, atomically; after real
SIGKILLs (inside the exports, at the end, and at a random point after a checkpoint) no export is
lost or doubled and the exports hold the weights a run never killed exports."""
from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch

import supervisor
from hooks import EvaluationHook, StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.estimator import BestExporter, FinalExporter, LatestExporter
from tests import zygote
from tests.killing import kill_after_checkpoint, trainer_env

EXPORTERS = ("latest_exporter", "best_exporter", "final_exporter")


def _exports(logdir, name):
    """``[(step, weights)]`` of an exporter's complete exports, oldest first."""
    base = os.path.join(str(logdir), "export", name)
    found = []
    for version in sorted((v for v in os.listdir(base) if v.isdigit()), key=int) if os.path.isdir(base) else ():
        with open(os.path.join(base, version, "eval_result.json")) as f:
            step = json.load(f)["global_step"]
        found.append((step, torch.load(os.path.join(base, version, "model.pt"), weights_only=True)))
    return found


def _eval_step(model, batch):
    return {"loss": torch.nn.functional.mse_loss(model(batch[0]), batch[1])}


def test_each_evaluation_is_exported_with_the_weights_it_evaluated(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    val = [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(2)]
    seen = {}

    def eval_step(m, batch):  # the weights as the evaluation saw them
        seen[len(seen)] = {k: v.clone() for k, v in m.state_dict().items()}
        return _eval_step(m, batch)

    hook = EvaluationHook(val, eval_step, every_n_steps=4, exporters=[
        LatestExporter(exports_to_keep=None), BestExporter(), FinalExporter()])
    with MonitoredTrainingSession(str(tmp_path), model=model, optimizer=opt, save_summaries_steps=None,
                                  log_step_count_steps=None, hooks=[hook, StopAtStepHook(last_step=14)]) as s:
        while not s.should_stop():
            def step():
                loss = model(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad(); loss.backward(); opt.step()
                return {"loss": loss}
            s.run(step)
    evaluated = [seen[i] for i in range(0, len(seen), len(val))]  # one per evaluation (2 batches each)
    latest = _exports(tmp_path, "latest_exporter")
    assert [step for step, _ in latest] == [4, 8, 12, 14]  # the end's evaluation too
    for (_, weights), expected in zip(latest, evaluated):
        assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)
    assert [step for step, _ in _exports(tmp_path, "final_exporter")] == [14]
    best = [step for step, _ in _exports(tmp_path, "best_exporter")]
    losses = {step: m["loss"] for step, m in supervisor.events.read_scalars(str(tmp_path / "eval")).items()}
    assert best[0] == 4 and all(losses[b] < losses[a] for a, b in zip(best, best[1:]))
    assert min(losses, key=losses.get) == best[-1]
    assert not [n for n in os.listdir(tmp_path / "export" / "latest_exporter") if n.startswith(".")]


@pytest.mark.parametrize("exporters, match", [
    ("best", "must be a list of exporters"),
    ([object()], "must be exporters"),
    ([LatestExporter(), LatestExporter()], "distinct names"),
])
def test_bad_exporters_are_refused_at_construction(exporters, match):
    with pytest.raises((TypeError, ValueError), match=match):
        EvaluationHook([1], exporters=exporters)


_TRAINER = """
import os, signal, sys, torch
from hooks import EvaluationHook, StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.estimator import BestExporter, Exporter, FinalExporter, LatestExporter

class KillAt(Exporter):  # a real SIGKILL between two exporters' exports, at the step named by KILL_AT
    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if eval_result["global_step"] == int(os.environ.get("KILL_AT", -1)):
            os.kill(os.getpid(), signal.SIGKILL)

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
g = torch.Generator().manual_seed(1)
val = [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)) for _ in range(2)]
ev = EvaluationHook(val, lambda m, b: {"loss": torch.nn.functional.mse_loss(m(b[0]), b[1])}, every_n_steps=5,
                    exporters=[LatestExporter(exports_to_keep=None), KillAt("kill"), BestExporter(), FinalExporter()])
with MonitoredTrainingSession(sys.argv[1], model=model, optimizer=opt, save_checkpoint_steps=10,
                              save_summaries_steps=None, hooks=[ev, StopAtStepHook(last_step=int(sys.argv[2]))]) as s:
    while not s.should_stop():
        def step():
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            return {"loss": loss}
        s.run(step)
"""


def _run(script, logdir, last_step, env, **extra):
    return zygote.python([script, logdir, last_step], env={**env, **extra}, timeout=180)


@pytest.mark.slow
def test_after_kills_no_export_is_lost_or_doubled(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TRAINER)
    env = trainer_env()
    reference = _run(script, tmp_path / "ref", 40, env)
    assert reference.returncode == 0, reference.stderr
    logdir = tmp_path / "run"
    # killed between the Latest and the Best exports of step 25, after checkpoint 20: the Latest
    # one exists; the resumed run evaluates 25 again from checkpoint 20
    killed = _run(script, logdir, 40, env, KILL_AT="25")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [step for step, _ in _exports(logdir, "latest_exporter")] == [5, 10, 15, 20, 25]
    assert [step for step, _ in _exports(logdir, "best_exporter")][-1] < 25
    # killed wherever it is once a checkpoint past 20 commits (or finished by then)
    kill_after_checkpoint([str(script), str(logdir), "40"], str(logdir), past_step=20, env=env)
    # killed inside the end's final exports (after checkpoint 40), or offering 40 again as final
    killed = _run(script, logdir, 40, env, KILL_AT="40")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    for _ in range(2):  # finishes; then a rerun of the finished job exports nothing more
        done = _run(script, logdir, 40, env)
        assert done.returncode == 0, done.stderr
    for name in EXPORTERS:
        got, expected = _exports(logdir, name), _exports(tmp_path / "ref", name)
        assert [step for step, _ in got] == [step for step, _ in expected], name  # none lost, none twice
        for (_, weights), (_, ref) in zip(got, expected):
            assert all(torch.equal(weights[k], ref[k]) for k in ref), name  # the weights a clean run exported
    assert [s for s, _ in _exports(logdir, "latest_exporter")] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert [s for s, _ in _exports(logdir, "final_exporter")] == [40]


def test_a_resumed_run_keeps_the_schedule_of_a_run_never_restarted(tmp_path):
    """every_n_steps=5 evaluates at 5, 10, 15 whatever step the run resumed at (7 here), as an
    epoch-end evaluation must: not at 12, 17 counted from the restored step."""
    g = torch.Generator().manual_seed(1)
    val = [(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))]
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for last_step in (7, 17):
        with MonitoredTrainingSession(str(tmp_path), model=model, optimizer=opt, save_summaries_steps=None,
                                      log_step_count_steps=None, hooks=[
                                          EvaluationHook(val, _eval_step, every_n_steps=5, exporters=[
                                              LatestExporter(exports_to_keep=None)]),
                                          StopAtStepHook(last_step=last_step)]) as s:
            while not s.should_stop():
                s.run(lambda: model(torch.randn(8, 4)).pow(2).mean())
    assert list(supervisor.events.read_scalars(str(tmp_path / "eval"))) == [5, 7, 10, 15, 17]
    assert [step for step, _ in _exports(tmp_path, "latest_exporter")] == [5, 7, 10, 15, 17]
