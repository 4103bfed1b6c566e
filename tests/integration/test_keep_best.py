"""Keeping the best checkpoints by the evaluation's metric (issue 34 item 2), end to end: a real
training run with `EvaluationHook` (local and on a real S3-compatible server), a SIGKILL and a
restart, and the step outputs as the metric in a session without an evaluation."""
from __future__ import annotations

import json
import os
import re

import pytest

from supervisor import MonitoredTrainingSession, get_checkpoint_state
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.storage import LocalStorage
from tests.cli.helpers import ROOT, cli, cli_json
from tests.integration import keep_best_trainer
from tests.killing import committed_step, kill_after_checkpoint, trainer_env
from tests.s3_fixtures import backend_logdir, lifetime_thread_prefixes, s3_server, s3_storage  # noqa: F401

pytestmark = pytest.mark.timeout(300)

TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keep_best_trainer.py")


def _steps(storage, logdir):
    """The steps of the committed-looking checkpoint names (not a kill's leftover temp names)."""
    return sorted(int(m.group(1)) for n in storage.listdir(logdir) if (m := re.fullmatch(r"model\.ckpt-(\d+)", n)))


def test_the_best_old_checkpoints_survive_recency_retention(backend_logdir):
    storage, logdir, storage_options = backend_logdir
    keep_best_trainer.main(logdir, 12, storage_options)
    # Evaluated (and so checkpointed) at 2, 4, ..., 12 with losses 2, 0, 2, 4, 6, 8.
    assert _steps(storage, logdir) == [2, 4, 12]
    index = read_index(logdir, storage)
    assert index.all_model_checkpoint_paths == ("model.ckpt-2", "model.ckpt-4", "model.ckpt-12")
    assert index.all_model_checkpoint_metrics == (2.0, 0.0, 8.0)
    assert (index.keep_best, index.max_to_keep, index.best_metric, index.best_mode) == (2, 1, "loss", "min")
    # ls reads the same from either backend: the metric and why each is kept
    extra = ["--storage-options", json.dumps(storage_options)] if storage_options else []
    result, rows = cli_json("ls", logdir, *extra)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["metric"], r["kept"]) for r in rows] == [
        (2, 2.0, ["best"]), (4, 0.0, ["best"]), (12, 8.0, ["newest"])]


@pytest.mark.slow
def test_the_same_best_are_kept_after_a_sigkill_and_a_restart(tmp_path):
    logdir = str(tmp_path / "logdir")
    env = trainer_env()
    killed_at = kill_after_checkpoint([TRAINER, logdir, "100000"], logdir, past_step=6, env=env)
    steps = _steps(LocalStorage(), logdir)
    assert {2, 4} <= set(steps) and killed_at >= 8, steps
    last = killed_at + 10
    keep_best_trainer.main(logdir, last)  # restarts from the killed run's checkpoint
    assert committed_step(logdir) == last
    # A restart that forgot the metrics would have deleted 2 and 4 at its first save.
    assert _steps(LocalStorage(), logdir) == [2, 4, last]
    assert get_checkpoint_state(logdir).all_model_checkpoint_metrics[:2] == (2.0, 0.0)


def test_without_an_evaluation_the_step_outputs_rank_checkpoints(tmp_path):
    """No EvaluationHook: the metric is the step's output of that name (here the returned dict's
    ``acc``, best highest); checkpoints every step, keep the newest 1 and the best 1."""
    import torch

    logdir = str(tmp_path / "logdir")
    model = torch.nn.Linear(1, 1)
    accuracies = {1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6, 5: 0.1}
    with MonitoredTrainingSession(logdir, model, save_checkpoint_steps=1, save_summaries_steps=None,
                                  log_step_count_steps=None, max_to_keep=1, keep_best=1, best_metric="acc",
                                  best_mode="max", handle_signals=False) as s:
        for step in range(1, 6):
            s.run(lambda step=step: {"acc": torch.tensor(accuracies[step]), "loss": 1.0})
    assert _steps(LocalStorage(), logdir) == [2, 5]


def test_keep_period_through_the_front_door(tmp_path):
    import torch

    logdir = str(tmp_path / "logdir")
    with MonitoredTrainingSession(logdir, torch.nn.Linear(1, 1), save_checkpoint_steps=1, save_summaries_steps=None,
                                  log_step_count_steps=None, max_to_keep=2, keep_period=4,
                                  handle_signals=False) as s:
        for _ in range(10):
            s.run(lambda: None)
    assert _steps(LocalStorage(), logdir) == [0, 4, 8, 9, 10]  # step 0 (the creation checkpoint) is a multiple too, as in Orbax


def _tty_output(args, env, timeout_secs=120.0) -> str:
    """``python -m supervisor ARGS`` (forked from the zygote, tests/zygote.py) with its stdout on a
    pseudo-terminal (unpiped), read until it exited (this process holds the terminal open meanwhile,
    so the child opens it whenever it starts and nothing it wrote is lost)."""
    import pty
    import select
    import time

    from tests import zygote

    master, slave = pty.openpty()
    proc = zygote.Forked(None, args, module="supervisor", output=os.ttyname(slave), stderr=os.devnull, env=env)
    chunks, deadline = [], time.monotonic() + timeout_secs
    try:
        while time.monotonic() < deadline:
            ended = proc.poll() is not None  # then what is left in the terminal is read to the end
            ready, _, _ = select.select([master], [], [], 0 if ended else 0.05)
            if ready:
                chunks.append(os.read(master, 65536))
            elif ended:
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
        os.close(slave)
        os.close(master)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_ls_shows_each_checkpoints_metric_and_why_it_is_kept(tmp_path):
    logdir = str(tmp_path / "logdir")
    keep_best_trainer.main(logdir, 12)
    result, rows = cli_json("ls", logdir)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["metric"], r["kept"]) for r in rows] == [
        (2, 2.0, ["best"]), (4, 0.0, ["best"]), (12, 8.0, ["newest"])]
    piped = cli("ls", logdir)
    assert piped.returncode == 0
    lines = piped.stdout.splitlines()
    assert re.match(r"^\s+STEP\s+NAME\s+SAVED\s+SIZE\s+METRIC\s+KEPT\s+STATUS$", lines[1]), lines
    assert re.search(r"model\.ckpt-4\s.*\s0\s+best\s+ok$", lines[3]), lines
    assert re.search(r"model\.ckpt-12\s.*\s8\s+newest\s+ok$", lines[4]), lines
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    unpiped = _tty_output(["ls", logdir], env)
    def words(text):  # the age may tick between the two runs (and so the column's width)
        return [re.sub(r"\S+ \w+ ago|just now", "AGE", line).split() for line in text.splitlines()[1:]]
    assert words(unpiped) == words(piped.stdout)


def test_the_end_evaluation_after_the_final_save_is_recorded_with_it(tmp_path):
    """Step 13 is not an evaluation step: the final checkpoint commits first, the evaluation at
    the end comes after it and is recorded in the index then (`report_metrics`' late path). The
    scheduled saves (5, 10) have no evaluation: recency only (the step outputs are ignored)."""
    logdir = str(tmp_path / "logdir")
    keep_best_trainer.main(logdir, 13, save_steps=5)
    index = get_checkpoint_state(logdir)
    assert [p.rsplit("-", 1)[1] for p in index.all_model_checkpoint_paths] == ["2", "4", "13"]
    assert index.all_model_checkpoint_metrics == (2.0, 0.0, 9.0)


def test_prune_keeps_each_remaining_checkpoints_metric_aligned(tmp_path):
    """`prune` rewrites the index: the metrics stay with their checkpoints, so the next writer
    keeps the same best ones (a misaligned or dropped list would forget them)."""
    logdir = str(tmp_path / "logdir")
    keep_best_trainer.main(logdir, 12)
    result = cli("prune", logdir, "--keep", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    index = get_checkpoint_state(logdir)
    assert [p.rsplit("-", 1)[1] for p in index.all_model_checkpoint_paths] == ["4", "12"]
    assert index.all_model_checkpoint_metrics == (0.0, 8.0) and index.keep_best == 2
