"""``ls``/``verify``/``inspect`` with ``--local-dir`` (SPEC §13, §17): both tiers are shown, what
a restart on this node restores is named, damage in the local tier is reported."""
from __future__ import annotations

import torch

from supervisor.checkpoint.tiers.manager import TieredCheckpointManager
from supervisor.state import TrainingState
from tests.cli.helpers import cli, cli_json, flip_byte


def _two_tiers(tmp_path) -> tuple[str, str]:
    logdir, local = str(tmp_path / "logdir"), str(tmp_path / "local")
    state = TrainingState.from_arguments(model=torch.nn.Linear(8, 4))
    with TieredCheckpointManager(logdir, local_dir=local, persist_every_steps=10, save_mode="sync") as manager:
        for step in (0, 5, 7):
            manager.save(step, state)
            manager.persister.flush(30)
        manager.persister.offer = lambda *a, **k: False  # step 7 stays local-only
    return logdir, local


def test_ls_shows_both_tiers_and_what_a_restart_restores(tmp_path):
    logdir, local = _two_tiers(tmp_path)
    result = cli("ls", logdir, "--local-dir", local)
    assert result.returncode == 0, result.stderr
    assert "local tier: " in result.stdout
    assert f"a restart on this node restores step 7 from the local tier ({local}/model.ckpt-7)" in result.stdout
    result, rows = cli_json("ls", logdir, "--local-dir", local)
    assert sorted((r["tier"], r["step"]) for r in rows) == [("local", 5), ("local", 7), ("persistent", 0)]


def test_verify_checks_the_local_tier_too_and_inspect_follows_the_restore(tmp_path):
    logdir, local = _two_tiers(tmp_path)
    assert cli("verify", logdir, "--local-dir", local).returncode == 0
    result, inspected = cli_json("inspect", logdir, "--local-dir", local)
    assert result.returncode == 0 and inspected["step"] == 7 and inspected["path"] == f"{local}/model.ckpt-7"
    flip_byte(f"{local}/model.ckpt-7/state.pt")
    result = cli("verify", logdir, "--local-dir", local)
    assert result.returncode == 1 and f"{local}/model.ckpt-7" in result.stdout and "FAILED" in result.stdout
    assert "restores step 5 from the local tier" in cli("ls", logdir, "--local-dir", local).stdout
    assert cli("verify", logdir).returncode == 0  # the logdir alone is intact
