"""Step-scheduled built-in hooks are not called on the steps before they act (the session's
gate), with the same results as calling them every step."""
from __future__ import annotations

import collections

import torch

import hooks
from supervisor import MonitoredSession, SessionCreator, TrainingState
from supervisor.testing import InMemorySummaryWriter


def _counting(monkeypatch, *classes):
    calls = collections.Counter()
    for cls in classes:
        for name in ("before_run", "after_run"):
            if name in cls.__dict__:
                original = cls.__dict__[name]

                def wrapper(self, *args, _original=original, _key=f"{cls.__name__}.{name}"):
                    calls[_key] += 1
                    return _original(self, *args)

                monkeypatch.setattr(cls, name, wrapper)
    return calls


def _session(hook_list):
    return MonitoredSession(SessionCreator(TrainingState({"model": torch.nn.Linear(1, 1)})), hooks=hook_list,
                            handle_signals=False)


def test_step_hooks_run_only_on_their_steps_and_write_the_same_summaries(monkeypatch):
    calls = _counting(monkeypatch, hooks.SummarySaverHook, hooks.StepCounterHook, hooks.StopAtStepHook)
    writer = InMemorySummaryWriter()
    hook_list = [hooks.SummarySaverHook(save_steps=10, summary_writer=writer),
                 hooks.StepCounterHook(every_n_steps=25, summary_writer=writer),
                 hooks.StopAtStepHook(last_step=100)]
    with _session(hook_list) as s:
        while not s.should_stop():
            s.run(lambda: {"loss": torch.tensor(float(s.global_step))})
        assert s.global_step == 100  # StopAtStepHook still stops exactly at last_step
    # written at the first step and every 10 steps after it, as with a call on every step
    assert [e.step for e in writer.scalars if e.tag == "loss"] == [1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 100]
    assert [e.step for e in writer.scalars if e.tag == "global_step/sec"] == [26, 51, 76]
    assert calls["SummarySaverHook.after_run"] < 40 and calls["StopAtStepHook.after_run"] < 40, calls


def test_a_subclass_that_overrides_after_run_is_called_every_step():
    seen = []

    class EveryStep(hooks.StopAtStepHook):
        def after_run(self, run_context, run_values):
            seen.append(run_context.session.global_step)
            super().after_run(run_context, run_values)

    with _session([EveryStep(last_step=30)]) as s:
        while not s.should_stop():
            s.run(lambda: None)
    assert seen == list(range(1, 31))


def test_a_recovery_asks_the_hooks_again():
    from supervisor import RecoverableError

    failures = [RecoverableError("transient")]
    stop = hooks.StopAtStepHook(num_steps=20)
    session = MonitoredSession(SessionCreator(TrainingState({"model": torch.nn.Linear(1, 1)})), hooks=[stop],
                               handle_signals=False, recovery_backoff_secs=0)

    def step():
        if session.global_step == 12 and failures:
            raise failures.pop()

    with session as s:
        while not s.should_stop():
            s.run(step)
        # re-created at step 0 (no checkpoint): num_steps counts again from there
        assert s.global_step == 20


def test_time_scheduled_hooks_skipped_until_their_time_write_at_the_same_steps():
    """The time gate is checked again after the step, so a deadline passed during step k is
    seen by the after_run of step k, as when the hook is called every step."""
    from supervisor.testing import FakeClock

    class Ungated(hooks.StepCounterHook):
        def after_run(self, run_context, run_values):  # overridden: the session never gates it
            super().after_run(run_context, run_values)

    class UngatedSummary(hooks.SummarySaverHook):
        def before_run(self, run_context):
            return super().before_run(run_context)

    written = {}
    for name, counter, summary in (("gated", hooks.StepCounterHook, hooks.SummarySaverHook),
                                   ("ungated", Ungated, UngatedSummary)):
        clock, writer = FakeClock(), InMemorySummaryWriter()
        hook_list = [counter(every_n_steps=None, every_n_secs=2.0, summary_writer=writer, clock=clock),
                     summary(save_secs=1.5, summary_writer=writer, clock=clock)]
        with _session(hook_list) as s:
            for _ in range(40):
                s.run(lambda: (clock.advance(0.35), {"loss": torch.tensor(1.0)})[1])
        written[name] = [(e.tag, e.step) for e in writer.scalars]
    assert written["gated"] == written["ungated"]
    assert len([t for t, _ in written["gated"] if t == "global_step/sec"]) >= 5


def test_a_time_scheduled_hook_is_not_called_before_its_deadline(monkeypatch):
    from supervisor.testing import FakeClock

    calls = _counting(monkeypatch, hooks.StepCounterHook)
    clock, writer = FakeClock(), InMemorySummaryWriter()
    with _session([hooks.StepCounterHook(every_n_steps=None, every_n_secs=10.0, summary_writer=writer,
                                         clock=clock)]) as s:
        for _ in range(100):
            s.run(lambda: clock.advance(0.5))  # 50 s in all: a rate every 20 steps
    assert [e.step for e in writer.scalars] == [21, 41, 61, 81]
    assert calls["StepCounterHook.after_run"] <= 10, calls  # not 100
