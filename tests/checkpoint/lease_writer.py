"""A checkpoint writer holding its logdir by ``lock="lease"``, in its own process
(test_writer_lease.py starts it, SIGKILLs or SIGSTOPs it):
``python lease_writer.py LOGDIR LEASE_SECS SIGNAL_DIR ENDPOINT_OR_-``.

It opens a `CheckpointManager` with ``lock="lease"``, commits step 1 and prints ``READY``; then
it waits for ``SIGNAL_DIR/go``, tries to commit step 2 and prints ``SAVED``, ``LOST: <why>``
(`LeaseLostError`) or ``FAILED: <why>``."""
from __future__ import annotations

import os
import sys
import time

import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.ownership.lease import LeaseLostError


def main() -> None:
    logdir, lease_secs, signals, endpoint = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
    extra = {} if endpoint == "-" else {"storage_options": {
        "endpoint_url": endpoint, "key": "testing", "secret": "testing",
        "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": 3}}}}
    model = torch.nn.Linear(4, 2)
    state = TrainingState.from_arguments(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    manager = CheckpointManager(logdir, lock="lease", lease_secs=lease_secs, save_mode="sync", **extra)
    manager.open()
    manager.save(1, state)
    print("READY", flush=True)
    go = os.path.join(signals, "go")
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no go signal within 120 s")
        time.sleep(0.01)
    with torch.no_grad():
        model.weight.add_(1.0)
    try:
        manager.save(2, state)
    except LeaseLostError as e:
        print(f"LOST: {e}".replace("\n", " "), flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"FAILED: {type(e).__name__}: {e}".replace("\n", " "), flush=True)
    else:
        print("SAVED", flush=True)
    manager.close(failed=True)


if __name__ == "__main__":
    main()
