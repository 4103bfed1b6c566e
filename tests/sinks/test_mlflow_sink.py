"""MLflow beside TensorBoard (issue 34 item 6), against a real MLflow store read back with
MLflow's own client: every scalar of the events file is in the run, a resume — in process or
after a real SIGKILL — continues the same run, a store that cannot be reached never fails
training, and sinks are checked at construction."""
from __future__ import annotations

import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import supervisor
from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession, Supervisor
from supervisor.sinks import MLflowSink
from tests import zygote
from tests.killing import kill_after_checkpoint, trainer_env

mlflow = pytest.importorskip("mlflow")  # the [test] extra installs it; the import error is named by MLflowSink
from mlflow.tracking import MlflowClient  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _file_store_allowed(monkeypatch):
    # MLflow 3 keeps its file store in "maintenance mode" behind this opt-in; it is the store that
    # works offline without a database driver, and the sink is the same client for any store.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _step(model, opt):
    def step():
        loss = model(torch.ones(4, 3)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        return {"loss": loss}
    return step


def _history(uri, run_id, key):
    return [(m.step, m.value) for m in sorted(MlflowClient(uri).get_metric_history(run_id, key), key=lambda m: m.timestamp)]


def _tensorboard(logdir, tag):
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_every_scalar_of_the_events_file_is_in_the_run_and_a_resume_continues_it(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    logdir = tmp_path / "run"
    model, opt = _model()
    sink = MLflowSink(experiment_name="exp", tracking_uri=uri)
    with MonitoredTrainingSession(str(logdir), model=model, optimizer=opt, save_summaries_steps=1,
                                  hooks=[StopAtStepHook(last_step=5)], summary_sinks=[sink]) as s:
        while not s.should_stop():
            s.run(_step(model, opt))
    run_id = sink.run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "exp"
    mlflow_points, tensorboard_points = _history(uri, run_id, "loss"), _tensorboard(logdir, "loss")
    assert [s for s, _ in mlflow_points] == [s for s, _ in tensorboard_points]
    assert [v for _, v in mlflow_points] == pytest.approx([v for _, v in tensorboard_points])
    assert [step for step, _ in _history(uri, run_id, "loss")] == [1, 2, 3, 4, 5]

    model, opt = _model()
    resumed = MLflowSink(experiment_name="exp", tracking_uri=uri)  # a new process would make a new one
    with MonitoredTrainingSession(str(logdir), model=model, optimizer=opt, save_summaries_steps=1,
                                  hooks=[StopAtStepHook(last_step=8)], summary_sinks=[resumed]) as s:
        assert s.global_step == 5
        while not s.should_stop():
            s.run(_step(model, opt))
    assert resumed.run_id == run_id
    assert [r.info.run_id for r in client.search_runs([client.get_run(run_id).info.experiment_id])] == [run_id]
    assert [step for step, _ in _history(uri, run_id, "loss")] == [1, 2, 3, 4, 5, 6, 7, 8]


def test_a_run_written_without_a_sink_resumes_with_one_and_the_other_way_round(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    for sinks, last in (([], 2), ([MLflowSink(tracking_uri=uri)], 4), ([], 6)):
        model, opt = _model()
        with Supervisor(str(tmp_path / "run"), model=model, optimizer=opt, summary_sinks=sinks, save_summaries_secs=1,
                        hooks=[StopAtStepHook(last_step=last)]).managed_session() as s:
            while not s.should_stop():
                s.run(_step(model, opt))
        assert s.global_step == last


def test_an_unreachable_tracking_server_never_fails_or_stalls_training(tmp_path, caplog):
    model, opt = _model()
    sink = MLflowSink(tracking_uri="http://127.0.0.1:9", flush_secs=60)  # port 9: discard, nothing listens
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        with MonitoredTrainingSession(str(tmp_path), model=model, optimizer=opt, save_summaries_steps=1,
                                      hooks=[StopAtStepHook(last_step=3)], summary_sinks=[sink]) as s:
            while not s.should_stop():
                s.run(_step(model, opt))
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert s.global_step == 3 and sink.run_id is None
    assert "MLflow: could not create or resume the run" in caplog.text
    assert supervisor.latest_checkpoint(str(tmp_path)).endswith("-3")


@pytest.mark.parametrize("sinks, match", [
    ("mlflow", "summary_sinks must be a list of sinks"),
    ([object()], r"summary_sinks\[0\] must be a scalar sink"),
    ([MLflowSink], r"a class: create an instance"),
])
def test_bad_sinks_are_refused_at_construction(tmp_path, sinks, match):
    with pytest.raises(TypeError, match=match):
        Supervisor(str(tmp_path), summary_sinks=sinks)
    with pytest.raises(TypeError, match=match):
        MonitoredTrainingSession(str(tmp_path), summary_sinks=sinks)
    assert os.listdir(tmp_path) == []


def test_sinks_without_summaries_and_a_clashing_state_name_are_refused(tmp_path):
    with pytest.raises(ValueError, match="summary_sinks were given but this session writes no summaries"):
        Supervisor(str(tmp_path), save_summaries_secs=0, summary_sinks=[MLflowSink()])
    model, _ = _model()
    with pytest.raises(ValueError, match="under the name 'mlflow', which state= already uses"):
        MonitoredTrainingSession(str(tmp_path), state={"mlflow": model}, summary_sinks=[MLflowSink()])
    with pytest.raises(TypeError, match="tracking_uri must be a non-empty string"):
        MLflowSink(tracking_uri=5)


_TRAINER = """
import sys, torch
from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.sinks import MLflowSink
from tests.killing import kill_after_checkpoint, trainer_env
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
sink = MLflowSink(experiment_name="killed", tracking_uri=sys.argv[2], flush_secs=0.2)
with MonitoredTrainingSession(sys.argv[1], model=model, optimizer=opt, save_checkpoint_steps=5, save_summaries_steps=1,
                              hooks=[StopAtStepHook(last_step=int(sys.argv[3]))], summary_sinks=[sink]) as s:
    print("run", sink.run_id, "at", s.global_step, flush=True)
    while not s.should_stop():
        def step():
            loss = model(torch.ones(4, 3)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            return {"loss": loss}
        s.run(step)
print("run", sink.run_id, "ended", flush=True)
"""


@pytest.mark.slow
def test_a_job_killed_and_requeued_continues_the_same_run(tmp_path):
    script, logdir, uri = tmp_path / "train.py", str(tmp_path / "run"), (tmp_path / "mlruns").as_uri()
    script.write_text(_TRAINER)
    env = trainer_env(MLFLOW_ALLOW_FILE_STORE="true")
    restored = kill_after_checkpoint([str(script), logdir, uri, str(10**9)], logdir, past_step=9, env=env)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert run.info.status == "RUNNING"  # killed: nothing could mark it
    logged = {step for step, _ in _history(uri, run.info.run_id, "loss")}
    assert set(range(1, restored + 1)) <= logged  # flushed before each checkpoint was published
    rerun = zygote.python([script, logdir, uri, restored + 5], env=env, timeout=120)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"run {run.info.run_id} ended" in rerun.stdout
    (again,) = client.search_runs([client.get_experiment_by_name("killed").experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert set(range(1, restored + 6)) <= {step for step, _ in _history(uri, run.info.run_id, "loss")}
