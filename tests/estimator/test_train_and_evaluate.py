"""train_and_evaluate in local mode: evaluation triggers, evaluation on a copy (bit-identical
training), early stopping end to end, return values."""
from __future__ import annotations

import contextlib
import os
import signal
import threading

import torch

import hooks
from supervisor import Hook
from supervisor.estimator import BestExporter, EvalSpec, FinalExporter, LatestExporter, RunConfig, TrainSpec
from supervisor.estimator import estimator as estimator_module
from supervisor.estimator import train_and_evaluate
from supervisor.estimator.training import EvalResult, EvaluateAfterSaveListener, Evaluator
from supervisor.testing import FakeClock
from tests.estimator.estimator_toy import batches, endless, eval_scalars, make_estimator


class AdvanceClock(Hook):
    def __init__(self, clock, secs_per_step):
        self.clock, self.secs = clock, secs_per_step

    def after_run(self, run_context, run_values):
        self.clock.advance(self.secs)


def evaluated_steps(est):
    if not os.path.isdir(est.eval_dir()):
        return []
    return [step for step, _ in eval_scalars(est.eval_dir()).get("loss", [])]


def run(tmp_path, *, throttle_secs=0, secs_per_step=0.0, max_steps=20, input_fn=None, **spec):
    clock = FakeClock()
    est = make_estimator(tmp_path, clock=clock)
    train_spec = TrainSpec(input_fn or endless(), max_steps=max_steps, hooks=[AdvanceClock(clock, secs_per_step)])
    result = train_and_evaluate(est, train_spec, EvalSpec(lambda: batches(), steps=None,
                                                          throttle_secs=throttle_secs, **spec))
    return est, result


def test_every_commit_but_the_creation_one_is_evaluated(tmp_path):
    est, (metrics, exports) = run(tmp_path)
    assert evaluated_steps(est) == [5, 10, 15, 20]  # checkpoints 0 (creation), 5, ..., 20
    assert metrics["global_step"] == 20 and set(metrics) == {"loss", "accuracy", "global_step"}
    assert exports == ()


def test_throttle_end_to_end_first_and_final_only(tmp_path):
    est, (metrics, _) = run(tmp_path, throttle_secs=1e6, secs_per_step=15, max_steps=25)
    assert evaluated_steps(est) == [5, 25]  # 10, 15, 20 within the throttle; the final one always
    assert metrics["global_step"] == 25


class FakeManager:
    directory, basename = "/run", "model.ckpt"


class FakeSession:
    checkpoint_manager = FakeManager()


class RecordingEvaluator:
    is_final_export_triggered = False

    def __init__(self):
        self.calls = []

    def evaluate_and_export(self, path, *, final=False):
        self.calls.append((path, final))
        self.is_final_export_triggered = final
        return EvalResult({"global_step": int(path.rsplit("-", 1)[1])}, path)

    def export_final(self, result):
        self.calls.append(("export_final", result.checkpoint_path))
        return result


def test_throttle_rule_counts_from_the_start_of_the_last_evaluation():
    clock, evaluator = FakeClock(), RecordingEvaluator()
    listener = EvaluateAfterSaveListener(evaluator, 100, start_step=0, clock=clock)
    listener.begin()
    session = FakeSession()
    for advance, step in ((0, 0), (10, 5), (50, 10), (60, 15), (99, 20)):
        clock.advance(advance)
        listener.after_save(session, step)
    listener.end(session, 25)
    assert evaluator.calls == [("/run/model.ckpt-5", False), ("/run/model.ckpt-15", False),
                               ("/run/model.ckpt-25", True)]
    listener.end(session, 25)  # the final step already evaluated: only offered as the final export
    assert evaluator.calls[-1] == ("/run/model.ckpt-25", True)
    evaluator.is_final_export_triggered = False
    listener.end(session, 25)
    assert evaluator.calls[-1] == ("export_final", "/run/model.ckpt-25")


def test_final_evaluation_when_the_data_ends_before_a_save(tmp_path):
    finite = lambda: (b for _ in range(3) for b in batches())  # noqa: E731 - 18 steps of 6 batches
    est, (metrics, _) = run(tmp_path, throttle_secs=1e6, max_steps=None, input_fn=finite)
    assert evaluated_steps(est) == [5, 18]  # throttled in between; the final checkpoint of step 18
    assert metrics["global_step"] == 18


def test_resumed_run_does_not_evaluate_the_restored_checkpoint(tmp_path):
    run(tmp_path, max_steps=10)
    est, (metrics, _) = run(tmp_path, max_steps=20)
    assert evaluated_steps(est) == [5, 10, 15, 20]  # 10 once, from the first run
    assert metrics["global_step"] == 20
    again, (metrics_again, _) = run(tmp_path, max_steps=20)  # nothing to train: evaluate once
    assert metrics_again["global_step"] == 20


def test_exports_are_returned_and_final_exporter_exports_once(tmp_path):
    est, (metrics, exports) = run(tmp_path, exporters=[LatestExporter(exports_to_keep=2), BestExporter(),
                                                       FinalExporter()])
    latest, best, final = exports
    assert latest.startswith(str(tmp_path / "export" / "latest_exporter"))
    assert final.startswith(str(tmp_path / "export" / "final_exporter"))
    assert len(list((tmp_path / "export" / "final_exporter").iterdir())) == 1
    assert len(list((tmp_path / "export" / "latest_exporter").iterdir())) == 2


def final_weights(tmp_path, *, with_eval, preserve_rng=True, monkeypatch=None):
    if not preserve_rng:
        monkeypatch.setattr(estimator_module, "preserved_rng", contextlib.nullcontext)
    torch.manual_seed(123)
    est = make_estimator(tmp_path)
    spec = TrainSpec(endless(shuffle=True), max_steps=20)
    if with_eval:  # the eval input shuffles with the global RNG, the model has dropout
        train_and_evaluate(est, spec, EvalSpec(lambda: batches(shuffle=True), steps=3, throttle_secs=0))
        assert evaluated_steps(est) == [5, 10, 15, 20]
    else:
        est.train(spec.input_fn, max_steps=spec.max_steps)
    return {k: v.clone() for k, v in est.model.state_dict().items()}, torch.get_rng_state()


def test_evaluation_never_disturbs_training_bit_identical(tmp_path):
    plain, plain_rng = final_weights(tmp_path / "plain", with_eval=False)
    evaluated, evaluated_rng = final_weights(tmp_path / "eval", with_eval=True)
    assert plain.keys() == evaluated.keys()
    assert all(torch.equal(plain[k], evaluated[k]) for k in plain)
    assert torch.equal(plain_rng, evaluated_rng)


def test_the_bit_identical_check_detects_a_disturbed_rng(tmp_path, monkeypatch):
    plain, _ = final_weights(tmp_path / "plain", with_eval=False)
    disturbed, _ = final_weights(tmp_path / "eval", with_eval=True, preserve_rng=False, monkeypatch=monkeypatch)
    assert not all(torch.equal(plain[k], disturbed[k]) for k in plain)


class StepsSeen(Hook):
    def after_run(self, run_context, run_values):
        self.last = run_context.session.global_step


def test_early_stopping_ends_training_before_max_steps(tmp_path):
    est = make_estimator(tmp_path, lr=0.0)  # nothing improves: the loss never decreases
    seen = StepsSeen()
    stop = hooks.stop_if_no_decrease_hook(est, "loss", max_steps_without_decrease=10, run_every_secs=None,
                                          run_every_steps=1)
    metrics, _ = train_and_evaluate(est, TrainSpec(endless(), max_steps=1000, hooks=[stop, seen]),
                                    EvalSpec(lambda: batches(), steps=None, throttle_secs=0))
    # evaluations at 5, 10, 15: 15 - 5 >= 10 without a decrease -> stop at the next step
    assert evaluated_steps(est)[:3] == [5, 10, 15]
    assert seen.last < 1000 and est.checkpoint_step() == seen.last  # (when depends on the commit deliveries)
    assert metrics["global_step"] == seen.last


class RecordingListener(EvaluateAfterSaveListener):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delivered = []

    def after_save(self, session, global_step_value):
        self.delivered.append((global_step_value, session.global_step))
        return super().after_save(session, global_step_value)


class OpenGateAt(Hook):
    def __init__(self, gate, step):
        self.gate, self.step = gate, step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step == self.step:
            self.gate.set()


def test_the_evaluation_listener_never_makes_a_save_synchronous(tmp_path, monkeypatch):
    """The write of step 10 is held until step 13 has run: with a synchronous save, step 10's
    boundary would wait for it and never reach step 13 (the gate's wait times out)."""
    import supervisor.checkpoint.manager as manager_module

    gate, real_write = threading.Event(), manager_module.write_checkpoint

    def gated_write(directory, name, *args, **kwargs):
        if name.endswith("-10"):
            assert gate.wait(60), "the training loop waited for the write of step 10"
        return real_write(directory, name, *args, **kwargs)

    monkeypatch.setattr(manager_module, "write_checkpoint", gated_write)
    est = make_estimator(tmp_path)
    evaluator = Evaluator(est, EvalSpec(lambda: batches(), steps=1, throttle_secs=0), 20)
    listener = RecordingListener(evaluator, 0, start_step=0, clock=est.clock)
    est.train(endless(), max_steps=20, hooks=[OpenGateAt(gate, 13)], saving_listeners=[listener])
    delivered = dict(listener.delivered)
    assert delivered[10] > 13  # evaluated after the commit, at a later boundary
    assert evaluated_steps(est) == [5, 10, 15, 20]


def test_chief_and_worker_tasks_train_without_evaluating(tmp_path):
    chief = make_estimator(tmp_path, config=RunConfig(tmp_path, save_checkpoints_steps=5, task_type="chief",
                                                      log_step_count_steps=0, save_summary_steps=0))
    assert train_and_evaluate(chief, TrainSpec(endless(), max_steps=10), EvalSpec(lambda: batches())) == (None, None)
    assert chief.checkpoint_step() == 10 and not (tmp_path / "eval").exists()
    worker = make_estimator(tmp_path, config=RunConfig(tmp_path, save_checkpoints_steps=5, task_type="worker",
                                                       log_step_count_steps=0, save_summary_steps=0))
    seen = StepsSeen()
    assert train_and_evaluate(worker, TrainSpec(endless(), max_steps=15, hooks=[seen]),
                              EvalSpec(lambda: batches())) == (None, None)
    assert seen.last == 15  # the worker started from the chief's checkpoint of step 10
    assert worker.checkpoint_step() == 10  # and never writes


def test_evaluator_task_in_process_final_export_and_restart(tmp_path):
    trainer = make_estimator(tmp_path)
    trainer.train(endless(), max_steps=10)  # a clean end: the run is marked finished
    spec = EvalSpec(lambda: batches(), steps=None, start_delay_secs=0, throttle_secs=0,
                    exporters=[FinalExporter()])
    config = RunConfig(tmp_path, task_type="evaluator", log_step_count_steps=0, save_summary_steps=0)
    evaluator = make_estimator(tmp_path, config=config, clock=FakeClock())
    metrics, (final_export,) = train_and_evaluate(evaluator, TrainSpec(endless()), spec)
    assert metrics["global_step"] == 10 and evaluated_steps(evaluator) == [10]
    assert final_export.startswith(str(tmp_path / "export" / "final_exporter"))  # the finished run's final
    restarted = make_estimator(tmp_path, config=config, clock=FakeClock())
    assert train_and_evaluate(restarted, TrainSpec(endless()), spec) == (None, None)  # step 10 was done
    assert evaluated_steps(restarted) == [10]


def test_a_preempted_run_skips_the_final_evaluation():
    clock, evaluator = FakeClock(), RecordingEvaluator()
    listener = EvaluateAfterSaveListener(evaluator, 1e6, start_step=0, clock=clock)
    listener.begin()
    session = FakeSession()
    listener.after_save(session, 5)
    session.preempted = True
    listener.end(session, 7)
    assert evaluator.calls == [("/run/model.ckpt-5", False)]


def resumable_run(model_dir, max_steps):
    from tests.estimator.estimator_toy import ShuffledLoader

    loader = ShuffledLoader()
    est = make_estimator(model_dir, state={"data": loader})
    train_and_evaluate(est, TrainSpec(lambda: loader, max_steps=max_steps),
                       EvalSpec(lambda: batches(shuffle=True), steps=2, throttle_secs=0))
    return {k: v.clone() for k, v in est.model.state_dict().items()}


def test_resume_with_evaluations_in_the_loop_is_bit_identical(tmp_path):
    torch.manual_seed(7)
    uninterrupted = resumable_run(tmp_path / "a", 20)
    torch.manual_seed(7)
    resumable_run(tmp_path / "b", 10)
    torch.manual_seed(99)  # the resumed process starts with other RNG states: the checkpoint restores them
    resumed = resumable_run(tmp_path / "b", 20)
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)


class SigtermAt(Hook):
    def __init__(self, step):
        self.step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_stops_training_without_the_final_evaluation(tmp_path):
    est = make_estimator(tmp_path)
    metrics, _ = train_and_evaluate(est, TrainSpec(endless(), max_steps=100, hooks=[SigtermAt(7)]),
                                    EvalSpec(lambda: batches(), steps=1, throttle_secs=0))
    assert est.checkpoint_step() == 7  # the final checkpoint of the preempted run
    # 7 is left to the resumed run (5 is evaluated if its commit arrived before the signal)
    assert 7 not in evaluated_steps(est) and (metrics is None or metrics["global_step"] == 5)
