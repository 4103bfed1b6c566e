"""keep_best / best_metric / keep_period with checkpoint tiers (issue 33; SPEC §17, §5.5): the best
K by the metric recorded at save time are kept in the logdir (a best step not due for
persistence is copied anyway), their metrics travel into the logdir's index and survive a
restart, ``ls`` shows METRIC/KEPT; the local tier keeps its newest ``local_max_to_keep`` only."""
from __future__ import annotations

import json
import re

import pytest
import torch

from supervisor import MonitoredTrainingSession
from supervisor.checkpoint.layout.index import read_index
from supervisor.checkpoint.storage import LocalStorage
from tests.cli.helpers import cli, cli_json

pytestmark = pytest.mark.timeout(180)

# Step outputs ranked by "acc" (best highest): steps 2 and 5 are the best two, and neither is due
# for persistence (persist_every_steps=4: steps 0, 4, 8 and the final one at close).
ACC = {1: 0.1, 2: 0.9, 3: 0.2, 4: 0.3, 5: 0.95, 6: 0.4, 7: 0.1, 8: 0.2, 9: 0.3, 10: 0.5, 11: 0.6, 12: 0.7}


def _train(logdir, local_dir, options, steps) -> None:
    with MonitoredTrainingSession(logdir, torch.nn.Linear(2, 1), save_checkpoint_steps=1, save_summaries_steps=None,
                                  log_step_count_steps=None, max_to_keep=1, keep_best=2, best_metric="acc",
                                  best_mode="max", keep_period=6, local_dir=local_dir, persist_every_steps=4,
                                  local_max_to_keep=2, storage_options=options, handle_signals=False) as s:
        while s.global_step < steps:
            s.run(lambda: {"acc": torch.tensor(ACC[s.global_step + 1]), "loss": 1.0})


def _steps(storage, directory) -> list[int]:
    return sorted(int(m.group(1)) for n in storage.listdir(directory) if (m := re.fullmatch(r"model\.ckpt-(\d+)", n)))


def test_the_best_steps_reach_the_logdir_and_stay_after_a_restart(backend_logdir, tmp_path):
    storage, logdir, options = backend_logdir
    local = str(tmp_path / "local")
    _train(logdir, local, options, 10)
    # best 2 (steps 2 and 5, only local when saved), the period step 6, the newest (10, at close)
    assert _steps(storage, logdir) == [0, 2, 5, 6, 10]
    index = read_index(logdir, storage=storage)
    assert index.all_model_checkpoint_paths == tuple(f"model.ckpt-{s}" for s in (0, 2, 5, 6, 10))
    assert index.all_model_checkpoint_metrics[1:] == pytest.approx((0.9, 0.95, 0.4, 0.5))  # step 0: none (NaN)
    assert (index.keep_best, index.best_metric, index.best_mode, index.keep_period) == (2, "acc", "max", 6)
    # The local tier: its newest local_max_to_keep (a copy still in flight at the last local save
    # is released only at the next local save: with a slower logdir, leftovers until then).
    assert _steps(LocalStorage(), local)[-2:] == [9, 10]
    if options is None:
        assert _steps(LocalStorage(), local) == [9, 10]
    extra = ["--storage-options", json.dumps(options)] if options else []
    result, rows = cli_json("ls", logdir, *extra)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["kept"]) for r in rows] == [(0, ["period"]), (2, ["best"]), (5, ["best"]),
                                                       (6, ["period"]), (10, ["newest"])]
    assert rows[0]["metric"] is None and [r["metric"] for r in rows[1:]] == pytest.approx([0.9, 0.95, 0.4, 0.5])
    table = cli("ls", logdir, *extra).stdout.splitlines()
    assert re.match(r"^\s+STEP\s+NAME\s+SAVED\s+SIZE\s+METRIC\s+KEPT\s+STATUS$", table[1]), table
    assert re.search(r"model\.ckpt-5\s.*\s0\.95\s+best\s+ok$", table[4]), table
    # A restart (resuming from the local tier) keeps the recorded metrics: 2 and 5 stay best.
    _train(logdir, local, options, 12)
    assert _steps(storage, logdir) == [0, 2, 5, 6, 12]
    index = read_index(logdir, storage=storage)
    assert index.all_model_checkpoint_metrics[1:] == pytest.approx((0.9, 0.95, 0.4, 0.7))


def test_a_best_step_not_due_is_persisted_even_when_the_logdir_is_slow(tmp_path):
    """A newer due save does not replace a pending copy that keep_best needs."""
    from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
    from supervisor.state import TrainingState

    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    state = TrainingState.from_arguments(model=torch.nn.Linear(2, 1))
    manager = TieredCheckpointManager(logdir, local_dir=local, persist_every_steps=3, save_mode="sync", max_to_keep=1,
                                      keep_best=1, best_metric="loss")
    manager.open()
    manager.persister.wait_open(30)
    for step, loss in ((1, 5.0), (2, 0.5), (3, 4.0)):
        manager.report_metrics(step, {"loss": loss}, source="outputs")
        manager.save(step, state)
    manager.close()
    assert _steps(LocalStorage(), logdir) == [2, 3]
    assert read_index(logdir).all_model_checkpoint_metrics == (0.5, 4.0)


def test_a_metric_after_the_local_commit_follows_the_copy_or_warns_when_too_late(tmp_path, caplog):
    """The evaluation at the end reports after the commit: a step not due is copied then, with its
    metric; one whose newer steps are persisted already is not kept, in a WARNING."""
    from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
    from supervisor.state import TrainingState

    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    state = TrainingState.from_arguments(model=torch.nn.Linear(2, 1))
    with TieredCheckpointManager(logdir, local_dir=local, persist_every_steps=2, save_mode="sync", max_to_keep=1,
                                 keep_best=1, best_metric="loss", local_max_to_keep=3) as manager:
        manager.persister.wait_open(30)
        manager.save(1, state)  # the first: persisted
        manager.save(2, state)  # not due
        manager.report_metrics(2, {"loss": 0.25})
        assert manager.persister.flush(30)
        assert _steps(LocalStorage(), logdir) == [2]  # step 1 (no metric) left by max_to_keep=1
        assert read_index(logdir).all_model_checkpoint_metrics[-1] == 0.25
        manager.save(4, state)  # due (2 steps after 2)
        manager.save(5, state)  # not due
        manager.save(6, state)  # due
        assert manager.persister.flush(30)
        with caplog.at_level("WARNING"):
            manager.report_metrics(5, {"loss": 0.01})
    assert "the checkpoint of step 5 is not kept there" in caplog.text
    assert _steps(LocalStorage(), logdir) == [2, 6]
