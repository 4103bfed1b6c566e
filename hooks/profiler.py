"""`ProfilerHook`: one-step `torch.profiler` traces on a schedule, for TensorBoard and Perfetto."""
from __future__ import annotations

import logging
import os
import socket
from typing import Any


from supervisor.clock import Clock
from supervisor.hook import Hook, RunContext, RunValues
from supervisor.toolkit import check_bool, check_directory, check_schedule

from hooks.timer import SecondOrStepTimer

__all__ = ["ProfilerHook"]

logger = logging.getLogger(__name__)


class ProfilerHook(Hook):
    """Traces one step every N steps or seconds with `torch.profiler` (TF's ``ProfilerHook``).

    TF semantics: the first step after `begin` is never traced (it carries one-off costs:
    lazy initialisation, allocator warm-up, compilation); it starts the schedule, so with
    ``save_steps=100`` from step 0 the steps that end at 100, 200, ... are traced, and with
    ``save_secs=60`` the first step that starts 60 s after the previous trace (or after the
    first step). Each trace covers the step function and the hooks around it, and is written
    as a Chrome trace to::

        <output_dir>/plugins/profile/step_<N>/<host>.pt.trace.json

    which TensorBoard's profile plugin lists as run ``step_<N>``, and Perfetto
    (ui.perfetto.dev) or ``chrome://tracing`` open directly.

    Args:
        save_steps: trace every this many steps (exactly one of ``save_steps``/``save_secs``).
        save_secs: trace every this many seconds.
        output_dir: where traces go; None: the session's log directory.
        record_shapes: record operator input shapes.
        profile_memory: record tensor memory allocations.
        with_stack: record Python stacks (large traces).
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    def __init__(self, save_steps: int | None = None, save_secs: float | None = None, *,
                 output_dir: str | None = None, record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, clock: Clock | None = None) -> None:
        every_steps, every_secs = check_schedule("ProfilerHook", ("save_steps", save_steps), ("save_secs", save_secs))
        self._timer = SecondOrStepTimer(every_secs=every_secs, every_steps=every_steps, clock=clock)
        self._output_dir = check_directory("output_dir", output_dir)
        self._options = {"record_shapes": check_bool("record_shapes", record_shapes),
                         "profile_memory": check_bool("profile_memory", profile_memory),
                         "with_stack": check_bool("with_stack", with_stack)}
        self._dir: str | None = None
        self._first = True
        self._profiler: Any = None
        self.trace_paths: list[str] = []

    def begin(self) -> None:
        self._first = True

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._dir = self._output_dir or session.logdir
        if self._dir is None:
            raise ValueError("ProfilerHook has nowhere to write traces: pass output_dir=... (the session has no logdir)")

    def before_run(self, run_context: RunContext) -> None:
        if self._first or not self._timer.should_trigger_for_step(run_context.session.global_step + 1):
            return None
        import torch.profiler

        self._discard()  # a trace started by a run that failed and is being retried
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities, **self._options)
        self._profiler.start()
        return None

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        if self._first:
            # Start the schedule at the first step, which is never traced.
            self._first = False
            self._timer.update_last_triggered_step(run_context.session.global_step - 1)
            return
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        step = run_context.session.global_step
        self._timer.update_last_triggered_step(step)
        path = self._trace_path(step)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        profiler.export_chrome_trace(path)
        self.trace_paths.append(path)
        logger.info("profiler trace of step %d written to %s", step, path)

    def end(self, session: Any) -> None:
        self._discard()

    def on_exception(self, session: Any, exc: BaseException) -> None:
        self._discard()

    def _discard(self) -> None:
        # A step traced but never finished (its run raised): stop the profiler, keep no trace.
        if self._profiler is not None:
            profiler, self._profiler = self._profiler, None
            profiler.stop()

    def _trace_path(self, step: int) -> str:
        host = socket.gethostname()
        rank = _distributed_rank()
        worker = host if rank is None else f"{host}_rank{rank}"
        return os.path.join(self._dir, "plugins", "profile", f"step_{step}", f"{worker}.pt.trace.json")


def _distributed_rank() -> int | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank()
    return None
