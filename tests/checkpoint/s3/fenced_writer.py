"""One of the two writers of test_stale_writer.py, in its own process:
``python fenced_writer.py ROLE LOGDIR ENDPOINT LEASE_SECS SIGNAL_DIR [first]``.

``stale`` (writer 1, through the test's holding proxy): opens a `CheckpointManager` with
``lock="lease"``, commits step 1 (weights 1.0) and prints ``READY``; on ``SIGNAL_DIR/go`` it saves
step 2 (weights 2.0: the proxy holds its manifest PUT while the test SIGSTOPs it past its lease)
and then step 3 (weights 3.0), as a training loop that tolerates failed saves would, printing
``SAVED <step>`` or ``FAILED <step>: <why>`` for each; it exits 0 either way. With ``first`` it
commits nothing before ``READY`` and saves steps 1 and 2 on ``go`` (the held one is its first).

``rightful`` (writer 2, straight to the server, as another host: the lease records this
process's host name as ``other-node``): takes the lease over as soon as it expires, prints
``OPENED``; on ``SIGNAL_DIR/go2`` it restores, saves steps 2 and 3 (weights 100 + step), prints
``SAVED``; on ``SIGNAL_DIR/released`` it saves steps 4 and 5 and prints ``DONE``. Any error ends
it with a traceback and status 1: the rightful holder must never die.
"""
from __future__ import annotations

import os
import socket
import sys
import time

import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.errors import LogdirInUseError

WAIT_SECS = 120.0


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT_SECS
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"no {os.path.basename(path)} signal within {WAIT_SECS:g} s")
        time.sleep(0.01)


def _state(value: float) -> tuple[TrainingState, torch.nn.Linear]:
    model = torch.nn.Linear(64, 64)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)
    return TrainingState.from_arguments(model=model), model


def _fill(model: torch.nn.Linear, value: float) -> None:
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(value)


def _manager(logdir: str, endpoint: str, lease_secs: float) -> CheckpointManager:
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
               "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 3},
                                 "connect_timeout": 5, "read_timeout": 120}}  # a held PUT is waited for
    return CheckpointManager(logdir, lock="lease", lease_secs=lease_secs, save_mode="sync", max_to_keep=None,
                             storage_options=options)


def stale(logdir: str, endpoint: str, lease_secs: float, signals: str, first: bool = False) -> None:
    state, model = _state(1.0)
    manager = _manager(logdir, endpoint, lease_secs)
    manager.open()
    if not first:
        manager.save(1, state)
    print("READY", flush=True)
    _wait_for(os.path.join(signals, "go"))
    for step in (1, 2) if first else (2, 3):
        _fill(model, float(step))
        try:
            manager.save(step, state)
        except Exception as e:  # noqa: BLE001 - reported to the test
            print(f"FAILED {step}: {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        else:
            print(f"SAVED {step}", flush=True)
    manager.close(failed=True)


def rightful(logdir: str, endpoint: str, lease_secs: float, signals: str, first: bool = False) -> None:
    socket.gethostname = lambda: "other-node"  # another host's identity in the lease record
    state, model = _state(0.0)
    deadline = time.monotonic() + WAIT_SECS
    while True:
        manager = _manager(logdir, endpoint, lease_secs)
        try:
            manager.open()
            break
        except LogdirInUseError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    print("OPENED", flush=True)
    _wait_for(os.path.join(signals, "go2"))
    restored = manager.restore(state)
    print(f"RESTORED {None if restored is None else restored.global_step}", flush=True)
    for step in (2, 3):
        _fill(model, 100.0 + step)
        manager.save(step, state)
    print("SAVED", flush=True)
    _wait_for(os.path.join(signals, "released"))
    for step in (4, 5):
        _fill(model, 100.0 + step)
        manager.save(step, state)
    manager.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    role, logdir, endpoint, lease, signal_dir = sys.argv[1:6]
    {"stale": stale, "rightful": rightful}[role](logdir, endpoint, float(lease), signal_dir, sys.argv[6:] == ["first"])
