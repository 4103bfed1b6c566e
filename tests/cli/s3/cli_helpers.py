"""Shared by the CLI-on-s3 tests: a run of 3 checkpoints written to a URL by the real manager,
and the CLI run in a subprocess configured by the environment (``AWS_ENDPOINT_URL``)."""
from __future__ import annotations

import json
import os
import subprocess

import torch

import supervisor
from tests import zygote
from tests.s3_fixtures import CREDENTIALS, options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def model(step: int) -> torch.nn.Module:
    torch.manual_seed(step)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 8))  # 1 MiB + 32 KiB


def write_run(url: str, endpoint: str, steps=(1, 2, 3), **kwargs) -> None:
    with supervisor.CheckpointManager(url, storage_options=options(endpoint), save_mode="sync", max_to_keep=None,
                                      **kwargs) as manager:
        for step in steps:
            manager.save(step, supervisor.TrainingState.from_arguments(model=model(step)))


def cli(endpoint: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m supervisor ARGV`` with the client configured by the environment only (a real
    process forked from an interpreter that imported the CLI once, and none of the modules that
    read the environment at import: tests/zygote.py)."""
    env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "PYTHONPATH": ROOT,
           "AWS_MAX_ATTEMPTS": "2"}
    return zygote.run(argv, timeout=timeout, env=env, cwd=ROOT)


def as_json(done: subprocess.CompletedProcess):
    return json.loads(done.stdout)
