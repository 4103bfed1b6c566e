"""One writer racing for logdirs' leases, in its own process (test_lease.py starts two):
``python lease_racer.py SIGNAL_DIR ROOT ENDPOINT_OR_- [ROOT ENDPOINT_OR_- ...]``.

For round ``i`` (one per logdir) it creates ``SIGNAL_DIR/ready-<i>-<pid>``, waits for
``SIGNAL_DIR/go-<i>``, tries to take the lease and prints ``WON`` or ``REFUSED: <why>``."""
from __future__ import annotations

import os
import sys
import time

from supervisor.checkpoint.ownership.lease import Lease
from supervisor.checkpoint.storage import storage_for
from supervisor.errors import LogdirInUseError


def race(index: int, signals: str, root: str, endpoint: str) -> None:
    options = None if endpoint == "-" else {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
                                             "config_kwargs": {"retries": {"mode": "standard",
                                                                           "total_max_attempts": 3}}}
    storage = storage_for(root, options)
    storage.listdir(root)  # connect before the start line
    lease = Lease(storage, root, lease_secs=30)
    open(os.path.join(signals, f"ready-{index}-{os.getpid()}"), "w").close()
    go = os.path.join(signals, f"go-{index}")
    deadline = time.monotonic() + 60
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("no start signal within 60 s")
        time.sleep(0.001)
    try:
        lease.acquire(renew=False)
    except LogdirInUseError as e:
        print(f"REFUSED: {e}".replace("\n", " "), flush=True)
        return
    print("WON", flush=True)


def main() -> None:
    signals, rest = sys.argv[1], sys.argv[2:]
    for index in range(len(rest) // 2):
        race(index, signals, rest[2 * index], rest[2 * index + 1])


if __name__ == "__main__":
    main()
