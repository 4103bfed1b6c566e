"""Shared by the CLI tests: a real logdir written by the checkpoint engine, and the real CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from torch import nn

import supervisor
from tests import zygote

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_logdir(path, steps=(100, 200, 300)) -> dict[int, dict[str, torch.Tensor]]:
    """Commits one checkpoint per step (different weights each); returns the saved weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    saved = {}
    manager = supervisor.CheckpointManager(str(path), max_to_keep=None, save_mode="sync")
    manager.open()
    try:
        for step in steps:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            manager.save(step, supervisor.TrainingState.from_arguments(model=model))
            saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        manager.close()
    return saved


def flip_byte(path) -> None:
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01
    with open(path, "wb") as f:
        f.write(data)


def cli(*args, timeout=120, fresh=False) -> subprocess.CompletedProcess:
    """``python -m supervisor ARGS`` in a real subprocess (this tree first on the path): forked
    from an interpreter that imported the CLI once (tests/zygote.py: ~2 s of ``import torch``
    less per command), or with ``fresh`` a new interpreter, for a test about the interpreter's
    own start or exit."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if not fresh:
        return zygote.run(args, timeout=timeout, env=env)
    return subprocess.run([sys.executable, "-m", "supervisor", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def cli_json(*args):
    result = cli(*args, "--json")
    return result, json.loads(result.stdout)
