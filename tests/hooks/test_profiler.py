"""ProfilerHook: TF's choice of traced steps; traces Perfetto/TensorBoard can open."""
from __future__ import annotations

import json
import socket

import pytest
import torch

from hooks import ProfilerHook
from supervisor import MonitoredSession, SessionCreator

from tests.hooks._helpers import run_steps


def matmul_step():
    a = torch.randn(8, 8)
    return {"loss": (a @ a).sum()}


def traced_steps(hook):
    return [int(path.split("step_")[1].split("/")[0]) for path in hook.trace_paths]


def test_save_secs_traces_at_2_5_and_4_5_secs_not_4_4(clock, tmp_path):
    hook = ProfilerHook(save_secs=2, output_dir=str(tmp_path), clock=clock)
    started = []
    with MonitoredSession(hooks=[hook]) as session:
        for offset_secs in [0.0, 1.0, 2.5, 4.4, 4.5]:  # when each step starts, from the first
            clock.advance(offset_secs - (started[-1] if started else 0.0))
            started.append(offset_secs)
            session.run(matmul_step)
    # Step 1 (t=0) is never traced and starts the schedule; step 3 (t=2.5) and step 5 (t=4.5).
    assert traced_steps(hook) == [3, 5]


@pytest.mark.parametrize(("save_steps", "runs", "expected"), [(3, 10, [3, 6, 9]), (1, 4, [2, 3, 4]), (5, 4, [])])
def test_save_steps_never_traces_the_first_step(tmp_path, save_steps, runs, expected):
    hook = ProfilerHook(save_steps=save_steps, output_dir=str(tmp_path))
    run_steps([hook], runs, step_fn=matmul_step)
    assert traced_steps(hook) == expected


def test_trace_file_layout_and_content(tmp_path):
    hook = ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    run_steps([hook], 2, step_fn=matmul_step)
    path = tmp_path / "plugins" / "profile" / "step_2" / f"{socket.gethostname()}.pt.trace.json"
    assert hook.trace_paths == [str(path)]
    trace = json.loads(path.read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert "aten::mm" in names  # the step function's work is in the trace


def test_defaults_to_the_session_logdir(tmp_path):
    hook = ProfilerHook(save_steps=1)
    run_steps([hook], 2, creator=SessionCreator(logdir=str(tmp_path)))
    assert hook.trace_paths[0].startswith(str(tmp_path / "plugins" / "profile"))


def test_no_output_dir_and_no_logdir_is_an_error():
    with pytest.raises(ValueError, match="ProfilerHook has nowhere to write traces: pass output_dir"):
        MonitoredSession(hooks=[ProfilerHook(save_steps=1)])


def test_a_failed_traced_step_leaves_no_profiler_running(tmp_path):
    hook = ProfilerHook(save_steps=1, output_dir=str(tmp_path))
    with pytest.raises(ZeroDivisionError):
        with MonitoredSession(hooks=[hook]) as session:
            session.run(matmul_step)
            session.run(lambda: 1 / 0)
    assert hook.trace_paths == []
    assert not torch.autograd.profiler._is_profiler_enabled
