"""A new user's first hour (issue 10), with real subprocesses and real event files: the README's
first command draws curves, a rerun says what to do, the first-screen snippet runs as written,
a preempted run exits non-zero and resumes, and a resume draws no fake stall."""
from __future__ import annotations

import glob
import os
import re
import signal
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

import supervisor
from tests import forked_io, zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")


def _env():
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}


def _run(args, cwd, timeout=240):
    return zygote.python(args, cwd=cwd, timeout=timeout, env=_env())


def _raw_scalars(logdir, tag):
    """Every (step, value) ever written under ``tag``, across events files (no TensorBoard purge)."""
    found = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in EventFileLoader(path).Load():
            found += [(event.step, _value(v)) for v in event.summary.value if v.tag == tag]
    return found


def _value(summary_value):
    if summary_value.HasField("simple_value"):
        return summary_value.simple_value
    return float(summary_value.tensor.float_val[0])


def _wait_for_checkpoint(logdir, proc, min_step, timeout_secs=120):
    deadline = time.monotonic() + timeout_secs
    while True:
        path = supervisor.latest_checkpoint(logdir)
        if path is not None and int(path.rsplit("-", 1)[1]) >= min_step:
            return int(path.rsplit("-", 1)[1])
        assert proc.poll() is None, forked_io.output(proc)
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)


@pytest.mark.slow
def test_readme_first_command_draws_loss_and_accuracy_and_a_rerun_says_how_to_go_on(tmp_path):
    result = _run([QUICKSTART], cwd=tmp_path)  # exactly the README's command: default settings
    assert result.returncode == 0, result.stdout + result.stderr
    logdir = tmp_path / "runs" / "quickstart"
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    loss, accuracy = acc.Scalars("loss"), acc.Scalars("accuracy")
    assert len(loss) >= 10 and len(accuracy) >= 10, (len(loss), len(accuracy))
    assert loss[-1].step == 1500 and accuracy[-1].step == 1500  # the final summary at close
    assert loss[-1].value < loss[0].value and accuracy[-1].value > accuracy[0].value  # it learned
    assert all(e.value > 0 for e in acc.Scalars("global_step/sec"))

    again = _run([QUICKSTART], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    (line,) = [line for line in again.stdout.splitlines() if "nothing to train" in line]
    assert "already at step 1500" in line and "python examples/quickstart.py --steps 3000" in line
    # (a rerun with a larger --steps resuming is test_examples.py's test_quickstart_trains_then_resumes)


@pytest.mark.slow
def test_kill_and_resume_draws_no_zero_step_rate_at_the_resumed_step(tmp_path):
    logdir = str(tmp_path / "run")
    proc = zygote.Forked(QUICKSTART, ["--logdir", logdir, "--steps", str(10**9), "--save-secs", "0.2"],
                         output=forked_io.new_file(tmp_path, "killed"), env=_env())
    try:
        _wait_for_checkpoint(logdir, proc, min_step=100)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    restored = int(supervisor.latest_checkpoint(logdir).rsplit("-", 1)[1])
    result = _run([QUICKSTART, "--logdir", logdir, "--steps", str(restored + 300)], cwd=tmp_path)
    assert result.returncode == 0 and f"resuming at step {restored}" in result.stdout, result.stdout
    rate = _raw_scalars(logdir, "global_step/sec")
    assert rate and (restored, 0.0) not in rate, rate
    assert all(value > 0 for step, value in rate if step >= restored), rate
    assert len([step for step, _ in _raw_scalars(logdir, "loss") if step > restored]) >= 2


# The README's first-screen snippet, run as written (it defines its own data, model and step; the
# prelude's are overridden): only logging is configured and the step budget is read from the environment.
_PRELUDE = """
import logging
import os
import torch
logging.basicConfig(level=logging.INFO)
torch.manual_seed(0)
if "STEPPED_FILE" in os.environ:  # the test's handshake (the snippet is README's, unchanged): a step ran
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda *_: open(os.environ["STEPPED_FILE"], "a").close())
dataset = torch.utils.data.TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,)))
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def train_step(batch):
    x, y = batch
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return {"loss": loss.detach(), "accuracy": (model(x).argmax(1) == y).float().mean()}
"""
_EPILOGUE = """
print(f"final step {s.global_step} preempted={s.preempted}")
"""


def _readme_snippet():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    snippet = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert "last_step=200" in snippet
    return snippet.replace("last_step=200", 'last_step=int(os.environ["LAST_STEP"])')


@pytest.mark.slow
def test_readme_snippet_trains_over_epochs_to_last_step_and_resumes(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_PRELUDE + _readme_snippet() + _EPILOGUE)
    env = {**_env(), "LAST_STEP": "60"}  # 2 batches per epoch: 30 epochs
    first = zygote.python([script], cwd=tmp_path, timeout=240, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "final step 60 preempted=False" in first.stdout
    env["LAST_STEP"] = "70"
    second = zygote.python([script], cwd=tmp_path, timeout=240, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "final step 70" in second.stdout and "restored step=60" in second.stderr


@pytest.mark.slow
def test_readme_snippet_exits_143_on_sigterm_after_the_final_checkpoint_and_the_rerun_resumes(tmp_path):
    # (the quickstart's SIGTERM -> 143 is test_preemption.py's test_sigterm_writes_final_checkpoint_and_exits_143)
    script = tmp_path / "train.py"
    script.write_text(_PRELUDE + _readme_snippet() + _EPILOGUE)
    logdir = str(tmp_path / "runs" / "exp")
    env = {**_env(), "LAST_STEP": str(10**9), "STEPPED_FILE": str(tmp_path / "stepped")}
    proc = zygote.Forked(str(script), [], cwd=tmp_path, output=forked_io.new_file(tmp_path, "preempted"), env=env)
    _wait_for_checkpoint(logdir, proc, min_step=0)
    stepped = tmp_path / "stepped"  # the prelude's handshake: an optimizer step has run (step 1 is under way)
    deadline = time.monotonic() + 120
    while not stepped.exists():
        assert proc.poll() is None and time.monotonic() < deadline, forked_io.output(proc)
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)  # honoured at the end of the step under way: the final checkpoint is past 0
    out = forked_io.communicate(proc, timeout=120)
    assert proc.returncode == 143, out
    stopped_at = int(supervisor.latest_checkpoint(logdir).rsplit("-", 1)[1])  # the final checkpoint
    assert stopped_at > 0 and "SIGTERM" in out

    env["LAST_STEP"] = str(stopped_at + 10)
    rerun = zygote.python([script], cwd=tmp_path, timeout=240, env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f"restored step={stopped_at}" in rerun.stderr
    assert f"final step {stopped_at + 10} preempted=False" in rerun.stdout
