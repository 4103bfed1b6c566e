"""Mistakes in user hooks get a message (issue 10 item 6): a misspelled hook method is named at
session creation, and ``before_run`` returning anything but RunArgs/None is a clear TypeError."""
from __future__ import annotations

import logging

import pytest

from supervisor import Hook, MonitoredSession, RunArgs


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_misspelled_hook_method_is_named_once_at_session_creation(caplog):
    class LossLogger(Hook):
        def after_runs(self, run_context, run_values):  # never called: the session calls after_run
            pass

        def beforeRun(self, run_context):  # noqa: N802
            pass

        def begin_epoch(self):  # a user's own method, not close to a hook method
            pass

    with MonitoredSession(hooks=[LossLogger(), LossLogger()]):
        pass
    with MonitoredSession(hooks=[LossLogger()]):
        pass
    warnings = sorted(_warnings(caplog))
    assert warnings == [
        "LossLogger defines after_runs(), which is not a hook method and is never called by the session; "
        "did you mean after_run()?",
        "LossLogger defines beforeRun(), which is not a hook method and is never called by the session; "
        "did you mean before_run()?",
    ]


def test_correct_hooks_get_no_warning(caplog):
    class Fine(Hook):
        def after_run(self, run_context, run_values):
            pass

        def after_training(self):
            pass

        def on_exception(self, session, exc):
            pass

    with MonitoredSession(hooks=[Fine()]):
        pass
    assert _warnings(caplog) == []


@pytest.mark.parametrize("returned", [["loss"], {"fetches": "loss"}, "loss"])
def test_before_run_returning_something_else_is_a_clear_type_error(returned):
    class AsksWrongly(Hook):
        def before_run(self, run_context):
            return returned

    with pytest.raises(TypeError) as info:
        with MonitoredSession(hooks=[AsksWrongly()]) as s:
            s.run(lambda: {"loss": 1.0})
    message = str(info.value)
    assert f"AsksWrongly.before_run returned {type(returned).__name__}" in message
    assert "RunArgs(fetches=['loss'])" in message


def test_a_run_args_subclass_is_accepted():
    class MyArgs(RunArgs):
        pass

    class Asks(Hook):
        def before_run(self, run_context):
            return MyArgs(fetches="loss")

        def after_run(self, run_context, run_values):
            self.seen = run_values.results

    hook = Asks()
    with MonitoredSession(hooks=[hook]) as s:
        s.run(lambda: {"loss": 2.0})
    assert hook.seen == 2.0
