"""MonitoredSession: hook order, stop, close, errors, recovery (SPEC §3.1–§3.3)."""
from __future__ import annotations

import threading

import pytest
import torch

from supervisor import (
    Coordinator,
    Hook,
    LooperThread,
    MonitoredSession,
    RecoverableError,
    Restored,
    RunArgs,
    SessionCreator,
    SingularMonitoredSession,
    TrainingState,
)
from supervisor.testing import FakeClock, RecordingHook

CREATE = ["begin", "after_create_session"]
STEP = ["before_run", "after_run"]


def noop():
    return {"loss": torch.tensor(0.5)}


class StopAt(Hook):
    def __init__(self, step):
        self.step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self.step:
            run_context.request_stop()


class Raise(Hook):
    def __init__(self, method, exc, at_step=1):
        self.method, self.exc, self.at_step = method, exc, at_step

    def before_run(self, run_context):
        if self.method == "before_run" and run_context.session.global_step + 1 == self.at_step:
            raise self.exc

    def after_run(self, run_context, run_values):
        if self.method == "after_run" and run_context.session.global_step == self.at_step:
            raise self.exc


def test_normal_run_of_three_steps():
    rec = RecordingHook()
    with MonitoredSession(hooks=[rec]) as s:
        for _ in range(3):
            s.run(noop)
        assert s.global_step == 3
    assert rec.calls == CREATE + STEP * 3 + ["end"]
    assert rec.events[2:] == [("before_run", 0), ("after_run", 1), ("before_run", 1),
                              ("after_run", 2), ("before_run", 2), ("after_run", 3), ("end", 3)]


def test_hook_requesting_stop():
    rec = RecordingHook()
    with MonitoredSession(hooks=[StopAt(2), rec]) as s:
        while not s.should_stop():
            s.run(noop)
        with pytest.raises(RuntimeError, match="run called after should_stop was requested"):
            s.run(noop)
    assert rec.calls == CREATE + STEP * 2 + ["end"]
    assert s.global_step == 2 and s.stop_reason == "StopAt requested stop at step 2"


def test_stop_iteration_from_body_is_a_clean_end():
    rec = RecordingHook()
    data = iter([1, 2])
    with MonitoredSession(hooks=[rec]) as s:
        while True:
            batch = next(data)  # raises StopIteration after two batches
            s.run(lambda b: {"b": b}, batch)
    assert rec.calls == CREATE + STEP * 2 + ["end"]
    assert "StopIteration" in s.stop_reason


def test_stop_iteration_from_a_hook_is_a_clean_end():
    class Exhausted(Hook):
        def before_run(self, run_context):
            if run_context.session.global_step == 2:
                raise StopIteration

    rec = RecordingHook()
    with MonitoredSession(hooks=[Exhausted(), rec]) as s:
        for _ in range(5):
            s.run(noop)
    assert rec.calls == CREATE + STEP * 2 + ["end"]
    assert s.global_step == 2


@pytest.mark.parametrize(
    "where, calls, step",
    [
        ("before_run", CREATE + STEP + ["on_exception"], 1),  # the recorder comes after the raiser
        ("step", CREATE + STEP + ["before_run", "on_exception"], 1),
        ("after_run", CREATE + STEP + ["before_run", "on_exception"], 2),
    ],
)
def test_exception_in_step_or_hook(where, calls, step):
    rec = RecordingHook()
    boom = ValueError("boom")
    hooks = [rec] if where == "step" else [Raise(where, boom, at_step=2), rec]

    def step_fn(i):
        if where == "step" and i == 1:
            raise boom
        return {"i": i}

    with pytest.raises(ValueError, match="boom") as info:
        with MonitoredSession(hooks=hooks) as s:
            for i in range(5):
                s.run(step_fn, i)
    assert info.value is boom
    assert rec.calls == calls
    assert rec.exceptions == [boom]
    assert s.global_step == step


def test_exception_in_looper_thread_stops_and_is_reraised_with_traceback():
    rec = RecordingHook()
    clock = FakeClock()
    started = threading.Event()

    def broken_service():
        started.set()
        raise OSError("service failed")

    class StartsService(Hook):
        def after_create_session(self, session, coord):
            LooperThread(coord, 1.0, broken_service, clock=clock, name="broken-service").start()

    with pytest.raises(OSError, match="service failed") as info:
        with MonitoredSession(hooks=[StartsService(), rec]) as s:
            assert started.wait(5)
            assert s.coord.wait_for_stop(5)
            assert s.should_stop()
            s.run(noop)  # the thread's error surfaces here
    assert "broken_service" in [f.name for f in info.traceback]
    assert rec.calls == CREATE + ["on_exception"]
    assert isinstance(rec.exceptions[0], OSError)


def test_thread_error_while_loop_ends_on_should_stop_is_reraised_at_close():
    rec = RecordingHook()

    class FailsInThread(Hook):
        def after_create_session(self, session, coord):
            def work():
                with coord.stop_on_exception():
                    raise KeyError("thread")
            t = threading.Thread(target=work)
            coord.register_thread(t)
            t.start()

    with pytest.raises(KeyError, match="thread"):
        with MonitoredSession(hooks=[FailsInThread(), rec]) as s:
            while not s.should_stop():
                pass  # a loop that only checks should_stop ends cleanly...
    assert rec.calls == CREATE + ["on_exception"]  # ...but close re-raises, no end hooks


class CountingCreator(SessionCreator):
    def __init__(self):
        super().__init__(TrainingState())
        self.creations = 0

    def create(self, session):
        self.creations += 1
        return super().create(session)


def test_recoverable_error_on_step_two_recreates_and_retries_once():
    rec = RecordingHook()
    creator = CountingCreator()
    attempts = []

    def step_fn(i):
        attempts.append(i)
        if i == 2 and attempts.count(2) == 1:
            raise RecoverableError("transient")
        return {"i": i}

    clock = FakeClock()
    with MonitoredSession(creator, hooks=[rec], clock=clock) as s:
        for i in (1, 2, 3):
            s.run(step_fn, i)
    assert attempts == [1, 2, 2, 3]
    assert creator.creations == 2
    assert rec.calls == (CREATE + STEP + ["before_run", "after_create_session"] + STEP * 2 + ["end"])
    assert rec.calls.count("begin") == 1 and rec.calls.count("after_create_session") == 2
    assert s.global_step == 3  # the retried step counted once
    assert clock.monotonic() == 1_000_000.0 + 1.0  # one backoff of recovery_backoff_secs


def test_recoverable_error_in_after_run_does_not_double_count_the_step():
    fail = [True]

    class FailsOnce(Hook):
        def after_run(self, run_context, run_values):
            if fail[0]:
                fail[0] = False
                raise RecoverableError("after_run")

    with MonitoredSession(hooks=[FailsOnce()], clock=FakeClock()) as s:
        s.run(noop)
    assert s.global_step == 1


def test_recovery_restores_from_what_the_creator_restores():
    class RestoresStep(SessionCreator):
        reinitialise_on_recreate = True

        def __init__(self):
            super().__init__()
            self.restores = [None, Restored(7, "/ckpt/model.ckpt-7")]

        def restore(self, session):
            return self.restores.pop(0)

    calls = []

    def step_fn():
        calls.append(1)
        if len(calls) == 2:
            raise RecoverableError("lost")

    with MonitoredSession(RestoresStep(), clock=FakeClock()) as s:
        s.run(step_fn)
        assert s.global_step == 1
        s.run(step_fn)
        assert s.global_step == 8  # restored to 7, then the retried step


def test_max_recoveries_bounds_retries_with_exponential_backoff():
    clock = FakeClock()
    start = clock.monotonic()

    def always():
        raise RecoverableError("down")

    rec = RecordingHook()
    with pytest.raises(RecoverableError, match="down"):
        with MonitoredSession(hooks=[rec], max_recoveries=3, recovery_backoff_secs=2.0, clock=clock) as s:
            s.run(always)
    assert rec.calls.count("after_create_session") == 4  # first creation + 3 recoveries
    assert clock.monotonic() - start == 2.0 + 4.0 + 8.0
    assert rec.calls[-1] == "on_exception"


def test_user_recoverable_exception_types():
    fails = [True]

    def step_fn():
        if fails.pop() if fails else False:
            raise ConnectionError("peer reset")
        return 1

    with MonitoredSession(recoverable_exceptions=(ConnectionError,), clock=FakeClock()) as s:
        assert s.run(step_fn) == 1


def test_singular_session_does_not_recover():
    with pytest.raises(RecoverableError):
        with SingularMonitoredSession() as s:
            s.run(lambda: (_ for _ in ()).throw(RecoverableError("no retry")))


def test_singular_session_exposes_raw_state():
    model = torch.nn.Linear(2, 2)
    creator = SessionCreator(TrainingState({"model": model}))
    with SingularMonitoredSession(session_creator=creator) as s:
        raw = s.raw_state()
        assert raw["model"] is model
        raw["extra"] = model  # mutable, unlike s.state
        with pytest.raises(TypeError):
            s.state["x"] = model


def test_close_twice_raises():
    s = MonitoredSession()
    s.close()
    with pytest.raises(RuntimeError, match="session is already closed"):
        s.close()
    with pytest.raises(RuntimeError, match="closed session"):
        s.run(noop)


def test_fetches_by_key_callable_and_structure():
    weight = torch.zeros(())
    rec = RecordingHook(fetches={"loss": "loss", "pair": ["acc", lambda: weight + 1]})
    with MonitoredSession(hooks=[rec]) as s:
        out = s.run(lambda: {"loss": torch.tensor(0.25), "acc": 0.5})
    result = rec.results[0]
    assert out["acc"] == 0.5
    assert isinstance(result["loss"], torch.Tensor) and result["loss"].item() == 0.25  # raw object
    assert result["pair"][0] == 0.5 and result["pair"][1].item() == 1.0


def test_single_value_output_is_fetchable_as_loss():
    rec = RecordingHook(fetches="loss")
    with MonitoredSession(hooks=[rec]) as s:
        s.run(lambda: torch.tensor(3.0))
    assert rec.results == [torch.tensor(3.0)]


def test_fetching_a_missing_key_names_the_hook_and_keys():
    with pytest.raises(KeyError, match=r"RecordingHook fetched 'acc' .* only the keys \['loss'\]"):
        with MonitoredSession(hooks=[RecordingHook(fetches="acc")]) as s:
            s.run(noop)


def test_hook_without_fetches_gets_none_and_tuple_structure_is_kept():
    plain, tupled = RecordingHook(), RecordingHook(fetches=("loss",))
    with MonitoredSession(hooks=[plain, tupled]) as s:
        s.run(noop)
    assert plain.results == [None]
    assert isinstance(tupled.results[0], tuple)


def test_feeds_become_keyword_arguments():
    seen = {}

    def step_fn(x, summarize=False, lr=None):
        seen.update(x=x, summarize=summarize, lr=lr)

    with MonitoredSession(hooks=[RecordingHook(feeds={"summarize": True}),
                                 RecordingHook(feeds={"lr": 0.1})]) as s:
        s.run(step_fn, 1)
    assert seen == {"x": 1, "summarize": True, "lr": 0.1}


@pytest.mark.parametrize(
    "hooks, kwargs, text",
    [
        ([RecordingHook(feeds={"a": 1}), RecordingHook(feeds={"a": 2})], {},
         "RecordingHook and RecordingHook both feed 'a'"),
        ([RecordingHook(feeds={"a": 1})], {"a": 0}, "feeds 'a', which the caller of run"),
    ],
)
def test_feed_conflicts_raise_and_nothing_runs(hooks, kwargs, text):
    ran = []
    with pytest.raises(RuntimeError, match=text):
        with MonitoredSession(hooks=hooks) as s:
            s.run(lambda **kw: ran.append(kw), **kwargs)
    assert ran == [] and s.global_step == 0


def test_hooks_called_in_list_order():
    order = []

    class Named(Hook):
        def __init__(self, name):
            self.name = name

        def before_run(self, run_context):
            order.append(("before", self.name))

        def after_run(self, run_context, run_values):
            order.append(("after", self.name))

        def end(self, session):
            order.append(("end", self.name))

    with MonitoredSession(hooks=[Named("a"), Named("b"), Named("c")]) as s:
        s.run(noop)
    assert order == [("before", "a"), ("before", "b"), ("before", "c"),
                     ("after", "a"), ("after", "b"), ("after", "c"),
                     ("end", "a"), ("end", "b"), ("end", "c")]


def test_methods_a_hook_does_not_override_are_not_called():
    class OnlyAfter(Hook):
        def after_run(self, run_context, run_values):
            pass

    hook = OnlyAfter()
    s = MonitoredSession(hooks=[hook])
    assert s.dispatch.before_hooks == [] and s.dispatch.after_hooks == [hook]
    s.close()


def test_run_context_exposes_original_call():
    seen = []

    class Peek(Hook):
        def before_run(self, run_context):
            seen.append(run_context.original_args)

    def step_fn(a, b=0):
        return a + b

    with MonitoredSession(hooks=[Peek()]) as s:
        assert s.run(step_fn, 1, b=2) == 3
    assert seen[0].fn is step_fn and seen[0].args == (1,) and seen[0].kwargs == {"b": 2}


def test_run_step_fn_with_hooks_and_request_stop():
    rec = RecordingHook()

    def step_fn(step_context):
        step_context.run_with_hooks(noop)
        if step_context.session.global_step == 2:
            step_context.request_stop()
        return "ok"

    with MonitoredSession(hooks=[rec]) as s:
        results = []
        while not s.should_stop():
            results.append(s.run_step_fn(step_fn))
    assert results == ["ok"]
    assert rec.calls == CREATE + STEP * 2 + ["end"]


def test_run_step_fn_rejects_wrong_signature():
    with MonitoredSession() as s:
        with pytest.raises(ValueError, match="exactly one argument named step_context"):
            s.run_step_fn(lambda ctx, extra: None)


def test_request_stop_with_exception_is_reraised_at_close():
    rec = RecordingHook()
    with pytest.raises(ValueError, match="bad data"):
        with MonitoredSession(hooks=[rec]) as s:
            s.run(noop)
            s.request_stop(ValueError("bad data"))
            assert s.should_stop()
    assert rec.calls[-1] == "on_exception"


def test_first_exception_wins_over_the_body_exception():
    class FailsInThread(Hook):
        def after_create_session(self, session, coord):
            coord.request_stop(OSError("first, from a thread"))

    with pytest.raises(OSError, match="first, from a thread"):
        with MonitoredSession(hooks=[FailsInThread()]):
            raise ValueError("second, from the body")


def test_exception_in_begin_or_creation_cleans_up():
    rec = RecordingHook()

    class BadBegin(Hook):
        def begin(self):
            raise ValueError("bad begin")

    with pytest.raises(ValueError, match="bad begin"):
        MonitoredSession(hooks=[rec, BadBegin()])
    assert rec.calls == ["begin", "on_exception"]


def test_exception_in_end_hook_runs_on_exception():
    rec = RecordingHook()

    class BadEnd(Hook):
        def end(self, session):
            raise OSError("final save failed")

    with pytest.raises(OSError, match="final save failed"):
        with MonitoredSession(hooks=[BadEnd(), rec]) as s:
            s.run(noop)
    assert rec.calls == CREATE + STEP + ["on_exception"]


def test_service_thread_still_running_after_grace_is_named():
    release = threading.Event()

    class Stubborn(Hook):
        def after_create_session(self, session, coord):
            t = threading.Thread(target=release.wait, name="stubborn-service", daemon=True)
            coord.register_thread(t)
            t.start()
            self.thread = t

    hook = Stubborn()
    try:
        with pytest.raises(RuntimeError, match="stubborn-service"):
            with MonitoredSession(hooks=[hook], stop_grace_secs=0.05) as s:
                s.run(noop)
    finally:
        release.set()
        hook.thread.join(5)


def test_boundary_actions_run_on_the_training_thread_after_the_step():
    seen = []
    with MonitoredSession() as s:
        s.call_at_boundary(lambda sess: seen.append((sess.global_step, threading.current_thread())))
        s.run(noop)
        s.run(noop)
    assert seen == [(1, threading.main_thread())]


def test_state_is_read_only_and_creator_runs_init_fns_in_order():
    order = []
    model = torch.nn.Linear(2, 1)
    creator = SessionCreator(TrainingState({"model": model}),
                             init_fn=lambda s: order.append("init"),
                             local_init_fn=lambda s: order.append("local_init"),
                             ready_fn=lambda s: order.append("ready"))
    with MonitoredSession(creator) as s:
        assert s.state["model"] is model
        with pytest.raises(TypeError):
            s.state["other"] = model
    assert order == ["init", "local_init", "ready"]


def test_ready_fn_failure_message():
    with pytest.raises(RuntimeError, match="model not ready after initialisation: vocab missing"):
        MonitoredSession(SessionCreator(ready_fn=lambda s: "vocab missing"))


def test_default_ready_check_fails_on_lazy_parameters():
    lazy = torch.nn.LazyLinear(3)
    with pytest.raises(RuntimeError, match=r"model not ready .* model\.weight"):
        MonitoredSession(SessionCreator(TrainingState({"model": lazy})))
    lazy(torch.zeros(1, 4))  # materialised: now ready
    MonitoredSession(SessionCreator(TrainingState({"model": lazy}))).close()


def test_save_checkpoint_without_a_checkpoint_directory_raises():
    with MonitoredSession() as s:
        with pytest.raises(RuntimeError, match="has no checkpoint directory"):
            s.save_checkpoint()


def test_non_stop_hooks_see_the_coordinator():
    seen = []

    class Grab(Hook):
        def after_create_session(self, session, coord):
            seen.append(coord)

    with MonitoredSession(hooks=[Grab()]) as s:
        assert seen == [s.coord] and isinstance(seen[0], Coordinator)


def test_reraised_error_keeps_its_cause():
    class Fails(Hook):
        def end(self, session):
            try:
                raise OSError(28, "No space left on device")
            except OSError as e:
                raise ValueError("final save failed") from e

    with pytest.raises(ValueError) as info:
        with MonitoredSession(hooks=[Fails()]):
            pass
    assert isinstance(info.value.__cause__, OSError)


def test_call_when_stopping_runs_once_at_the_stopping_steps_boundary():
    seen = []

    class Registers(Hook):
        def after_create_session(self, session, coord):
            session.call_when_stopping(lambda s: seen.append(s.global_step))

    with MonitoredSession(hooks=[Registers(), StopAt(3)]) as s:
        for _ in range(3):
            s.run(noop)
        assert seen == [3]  # right after the step that requested the stop, before close
    assert seen == [3]


def test_call_when_stopping_after_a_stop_from_another_thread():
    seen = []

    class Registers(Hook):
        def after_create_session(self, session, coord):
            session.call_when_stopping(lambda s: seen.append(s.global_step))

    with MonitoredSession(hooks=[Registers()]) as s:
        s.run(noop)
        def step_while_a_thread_stops():
            t = threading.Thread(target=s.request_stop)
            t.start()
            t.join(5)
        s.run(step_while_a_thread_stops)
        assert seen == [2]
