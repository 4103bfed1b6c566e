"""The store keys every rank must agree on (restore decisions, agreements, sharded saves) are
numbered by the process group, not by a process-global counter (issue 32): ranks whose processes
created different numbers of sessions before joining a group still meet in it."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

from supervisor.distributed import env

from .harness import ROOT, env_for, free_port


def _world_of_one() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    env.init_process_group("gloo", timeout_secs=30)


def test_each_process_group_numbers_its_keys_from_zero(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    before = [env.agreed_key("restore") for _ in range(3)]  # no group: this process's own count
    assert before[-1].endswith("/2")
    try:
        _world_of_one()
        first = [env.agreed_key("restore"), env.agreed_key("restore"), env.agreed_key("agreement"), env.agreed_key("dcp")]
        env.destroy_process_group(timeout_secs=10)
        _world_of_one()
        second = [env.agreed_key("restore"), env.agreed_key("agreement")]
    finally:
        env.destroy_process_group(timeout_secs=10)
    round_ = env.attempt()
    assert first == [f"supervisor/restore/{round_}/0", f"supervisor/restore/{round_}/1",
                     f"supervisor/agreement/{round_}/0", f"supervisor/dcp/{round_}/0"]
    assert second == [f"supervisor/restore/{round_}/0", f"supervisor/agreement/{round_}/0"]


def test_no_process_global_counter_names_a_store_key():
    """The three counters that did (restore, agreement, dcp) are gone; none may come back."""
    for path in sorted((pathlib.Path(ROOT) / "supervisor").rglob("*.py")):
        tree = ast.parse(path.read_text())
        counters = [node.targets[0].id for node in tree.body if isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "itertools.count"
                    and isinstance(node.targets[0], ast.Name)]
        text = path.read_text()
        keyed = [c for c in counters if f"next({c})" in text and "supervisor/" in text.split(f"next({c})")[0].rsplit("\n", 1)[-1]]
        assert not keyed, f"{path}: {keyed} number store keys per process; use supervisor.distributed.env.agreed_key"


@pytest.mark.slow
def test_ranks_with_different_histories_meet_in_a_new_group(tmp_path):
    port_a, port_b = str(free_port()), str(free_port())
    roles = ["veteran", "helper", "newcomer"]
    procs = [subprocess.Popen([sys.executable, "-m", "tests.distributed.regroup_worker", role, str(tmp_path / "a"),
                               str(tmp_path / "b"), port_a, port_b], cwd=ROOT, env=env_for(0, 2, int(port_a)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for role in roles]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.communicate()
    described = "\n".join(f"--- {role} (exit {p.returncode})\n{out[-3000:]}" for role, p, out in zip(roles, procs, outputs))
    assert [p.returncode for p in procs] == [0, 0, 0], described
    veteran, newcomer = (json.loads(next(line[len("RESULT "):] for line in out.splitlines() if line.startswith("RESULT ")))
                         for out in (outputs[0], outputs[2]))
    assert (veteran["start"], veteran["end"]) == (newcomer["start"], newcomer["end"]) == (0, 3), described
    assert veteran["digest"] == newcomer["digest"], described  # one DDP job: the same weights
