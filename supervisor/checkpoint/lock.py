"""The logdir's ownership lock (SPEC §5.6).

The writing process holds ``logdir/.supervisor.lock`` (an OS file lock through ``filelock``, so
the kernel releases it when the process dies, even by SIGKILL) for the session's lifetime. A
lock file holds no content, so the holder's pid and host go in a sidecar,
``.supervisor.lock.owner`` (JSON), which a second writer reads to say who is in the way.
Readers (evaluators, the CLI) never take the lock.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time

import filelock

from supervisor.checkpoint.format import LOCK_FILE
from supervisor.errors import LogdirInUseError

__all__ = ["OwnershipLock", "OWNER_FILE"]

logger = logging.getLogger(__name__)

OWNER_FILE = LOCK_FILE + ".owner"


class OwnershipLock:
    """Exclusive, non-blocking ownership of a logdir.

    Example::

        lock = OwnershipLock(logdir)
        lock.acquire()        # LogdirInUseError at once when another process holds it
        ...
        lock.release()
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_FILE)
        self.owner_path = os.path.join(directory, OWNER_FILE)
        # thread_local=False: close() may run on another thread than open().
        self._lock = filelock.FileLock(self.path, timeout=0, thread_local=False)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def acquire(self) -> None:
        """Takes the lock or raises `LogdirInUseError` naming the holder's pid and host."""
        if self._lock.is_locked:
            return
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            raise LogdirInUseError(
                f"the logdir {self.directory} is in use by another writer ({self._describe_owner()}, "
                f"lock file {self.path}); stop that process or give this run another logdir"
            ) from None
        try:
            self._write_owner()
        except OSError as e:
            logger.warning("could not record this process as the owner of %s in %s: %s",
                           self.directory, self.owner_path, e)

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        try:
            if self._read_owner().get("pid") == os.getpid():
                os.remove(self.owner_path)
        except (OSError, ValueError):
            pass
        finally:
            self._lock.release()

    def _write_owner(self) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        tmp = f"{self.owner_path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(owner, f)
        os.replace(tmp, self.owner_path)

    def _read_owner(self) -> dict:
        with open(self.owner_path, encoding="utf-8") as f:
            owner = json.load(f)
        if not isinstance(owner, dict):
            raise ValueError("owner record is not an object")
        return owner

    def _describe_owner(self) -> str:
        try:
            owner = self._read_owner()
        except (OSError, ValueError):
            return f"pid and host unknown: {self.owner_path} is missing or unreadable"
        since = owner.get("since")
        when = (f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
                if isinstance(since, (int, float)) else "")
        return f"pid {owner.get('pid')} on host {owner.get('host')}{when}"
