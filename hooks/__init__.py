"""The built-in hook library of torch-supervisor (SPEC §8), TensorFlow's session-run hooks
rebuilt for PyTorch, plus the hook protocol re-exported from `supervisor`.

Example::

    import hooks
    from supervisor import MonitoredSession

    with MonitoredSession(hooks=[hooks.StopAtStepHook(last_step=1000),
                                 hooks.NanTensorHook(),
                                 hooks.LoggingTensorHook(["loss"], every_n_iter=100)]) as s:
        while not s.should_stop():
            s.run(train_step, next(batches))

`hooks` imports `supervisor`; `supervisor` never imports `hooks` at import time.
"""
from __future__ import annotations

__torch_supervisor_package__ = True  # see supervisor/_shadowing.py

import sys


def _shadowed() -> ImportError:
    found = getattr(sys.modules.get("supervisor"), "__file__", None)
    return ImportError(
        f"hooks needs torch-supervisor's 'supervisor' package, but import 'supervisor' found "
        f"{found}, which shadows it (it comes first on sys.path); rename "
        "your supervisor.py (e.g. to my_supervisor.py), or uninstall supervisord's `supervisor` package: it "
        "cannot share an environment with torch-supervisor")


try:  # the protocol's own module: hooks never imports the supervisor package's front doors
    from supervisor.hook import Hook, IdleUntil, RunArgs, RunContext, RunValues
except ImportError as error:  # a supervisor.py, or supervisord's package, shadows ours
    raise _shadowed() from error
if not getattr(sys.modules.get("supervisor"), "__torch_supervisor_package__", False):
    raise _shadowed()

from hooks.basic import FeedFnHook, FinalOpsHook, GlobalStepWaiterHook
from hooks.checkpoint import CheckpointSaverHook, CheckpointSaverListener, SaveScheduleOnWorker  # the last: front doors only
from hooks.early_stopping import (
    EarlyStoppingHook,
    make_early_stopping_hook,
    read_eval_metrics,
    stop_if_higher_hook,
    stop_if_lower_hook,
    stop_if_no_decrease_hook,
    stop_if_no_increase_hook,
)
from hooks.evaluation import EvaluationHook
from hooks.logging_hook import LoggingTensorHook
from hooks.nan import NanTensorHook
from hooks.profiler import ProfilerHook
from hooks.progress import ProgressBarHook
from hooks.step_counter import StepCounterHook
from hooks.stop import StopAtSecsHook, StopAtStepHook
from hooks.summary import SummarySaverHook
from hooks.timer import NeverTriggerTimer, SecondOrStepTimer

__all__ = [
    "CheckpointSaverHook",
    "CheckpointSaverListener",
    "EarlyStoppingHook",
    "EvaluationHook",
    "FeedFnHook",
    "FinalOpsHook",
    "GlobalStepWaiterHook",
    "Hook",
    "IdleUntil",
    "LoggingTensorHook",
    "NanTensorHook",
    "NeverTriggerTimer",
    "ProfilerHook",
    "ProgressBarHook",
    "RunArgs",
    "RunContext",
    "RunValues",
    "SecondOrStepTimer",
    "StepCounterHook",
    "StopAtSecsHook",
    "StopAtStepHook",
    "SummarySaverHook",
    "make_early_stopping_hook",
    "read_eval_metrics",
    "stop_if_higher_hook",
    "stop_if_lower_hook",
    "stop_if_no_decrease_hook",
    "stop_if_no_increase_hook",
]
