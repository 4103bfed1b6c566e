"""Shared fixtures: every test fails if it leaves a thread running."""
from __future__ import annotations

import threading
import time

import pytest


@pytest.fixture
def lifetime_thread_prefixes() -> tuple[str, ...]:
    """Names of threads a library keeps for the process's lifetime (a folder's conftest adds its
    own, e.g. fsspec's IO loop under tests/storage)."""
    return _ALLOWED_PREFIXES


@pytest.fixture(autouse=True)
def no_leaked_threads(lifetime_thread_prefixes):
    """Fails a test that leaves behind a thread it started."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    while True:
        leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()
                  and not t.name.startswith(lifetime_thread_prefixes)]
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert not leaked, f"test leaked threads: {[t.name for t in leaked]}"


# Threads owned by libraries for the process's lifetime, not by a test.
_ALLOWED_PREFIXES = ("pydevd", "ThreadPoolExecutor-", "Dummy-", "tqdm_monitor")
