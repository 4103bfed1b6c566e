"""The contributor exercise of a new agreement rule (examples/save_on_preemption.py): its table
as a pure function, and the seam (`supervisor.agreement.register_rule`) applying it in a session."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from examples import save_on_preemption as rule
from supervisor import MonitoredTrainingSession
from supervisor.agreement import Decision, apply_rules, register_rule, unregister_rule

SAVED = Decision(5, save=True, stop=True, save_reasons=("mine",), stop_reason="received SIGTERM", preempted=True)


@pytest.mark.parametrize("decision, expected", [
    (Decision(5), Decision(5)),
    (Decision(5, save=True, save_reasons=("x",)), Decision(5, save=True, save_reasons=("x",))),
    (Decision(5, stop=True, stop_reason="done"), Decision(5, stop=True, stop_reason="done")),
    (Decision(5, stop=True, stop_reason="received SIGTERM", preempted=True),
     Decision(5, save=True, stop=True, save_reasons=(rule.REASON,), stop_reason="received SIGTERM", preempted=True)),
    (SAVED, SAVED),  # a save already decided keeps its reasons
])
def test_save_on_preemption_table(decision, expected):
    assert rule.save_on_preemption(decision) == expected


def test_rules_apply_in_order_and_a_wrong_result_names_the_rule():
    def stop_all(decision):
        return Decision(decision.step, stop=True, stop_reason="r", preempted=True)

    def wrong(decision):
        return None

    for r in (stop_all, rule.save_on_preemption):
        register_rule(r)
    try:
        assert apply_rules(Decision(3, save=True)).save_reasons == (rule.REASON,)
        register_rule(wrong)
        with pytest.raises(TypeError, match="rule .*wrong.* returned None for step 3"):
            apply_rules(Decision(3, save=True))
    finally:
        for r in (stop_all, rule.save_on_preemption, wrong):
            unregister_rule(r)
    assert apply_rules(Decision(3, save=True)) == Decision(3, save=True)


def _preempted_run(checkpoint_dir):
    with MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, model=torch.nn.Linear(2, 1),
                                  save_checkpoint_secs=None, save_checkpoint_steps=None, save_summaries_steps=None,
                                  log_step_count_steps=None, handle_signals=True) as s:
        s.run(lambda: None)
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.coord.wait_for_stop(5), "the signal did not request a stop"
        while not s.should_stop():
            s.run(lambda: None)
        assert s.preempted and s.global_step == 2
    return sorted(n for n in os.listdir(checkpoint_dir) if n.startswith("model.ckpt-"))


def test_a_registered_rule_checkpoints_the_preempted_step(tmp_path):
    """No save schedule: a preemption leaves no checkpoint, unless the rule is registered."""
    assert _preempted_run(str(tmp_path / "plain")) == []
    rule.register()
    try:
        assert _preempted_run(str(tmp_path / "ruled")) == ["model.ckpt-2"]
    finally:
        rule.unregister()


@pytest.mark.slow
def test_on_every_rank_of_a_gloo_job_the_rule_checkpoints_the_agreed_preempted_step(tmp_path):
    """SIGTERM to rank 1 only, no save schedule: every rank stops preempted at the same step and,
    with the rule registered on every rank, the chief commits that step's checkpoint."""
    from tests.distributed.harness import describe, run_job

    for with_rule, expected in (("no", []), ("yes", None)):
        logdir = str(tmp_path / with_rule)
        results = run_job("preempted_without_schedule", 2, logdir, with_rule, timeout=150,
                          module="tests.distributed.rule_worker")
        assert [r.returncode for r in results] == [0, 0], describe(results)
        ends = {r.result["end"] for r in results}
        assert len(ends) == 1 and all(r.result["preempted"] for r in results), describe(results)
        saved = sorted(n for n in os.listdir(logdir) if n.startswith("model.ckpt-"))
        assert saved == (expected if expected is not None else [f"model.ckpt-{ends.pop()}"]), describe(results)
