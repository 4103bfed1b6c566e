"""The logdir's ownership lock (SPEC §5.6).

The writing process holds ``logdir/.supervisor.lock`` (an OS file lock through ``filelock``, so
the kernel releases it when the process dies, even by SIGKILL) for the session's lifetime. A
lock file holds no content, so the holder's pid and host go in a sidecar,
``.supervisor.lock.owner`` (JSON), which a second writer reads to say who is in the way.
Readers (evaluators, the CLI) never take the lock.

The record is written just after the lock is taken, so a writer that loses the race to take
over from a dead holder can read the dead holder's record. It therefore waits (at most
`OWNER_RECORD_WAIT_SECS`) for a record naming a live process before it names anyone, and says
so when none appears.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time

import filelock

from supervisor.checkpoint.fileio import open_regular_file
from supervisor.checkpoint.format import LOCK_FILE
from supervisor.errors import CheckpointError, LogdirInUseError

__all__ = ["OwnershipLock", "OWNER_FILE", "OWNER_RECORD_WAIT_SECS"]

logger = logging.getLogger(__name__)

OWNER_FILE = LOCK_FILE + ".owner"
#: How long a refused writer waits for the new holder to record itself (see the module docstring).
OWNER_RECORD_WAIT_SECS = 2.0


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
        except OSError as e:  # EACCES, EROFS...: filelock's own error names neither fix nor logdir
            raise CheckpointError(
                f"cannot take the ownership lock {self.path} of the logdir {self.directory} "
                f"({errno.errorcode.get(e.errno or 0, type(e).__name__)}: {e.strerror or e}); make the logdir "
                "writable by this user or "
                "choose another one") from e
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
        with open_regular_file(self.owner_path, "r", encoding="utf-8") as f:  # a FIFO: refused, never waited on
            owner = json.load(f)
        if not isinstance(owner, dict):
            raise ValueError("owner record is not an object")
        return owner

    def _describe_owner(self) -> str:
        """Names the live holder, waiting briefly for a record that names one (see above)."""
        deadline = time.monotonic() + OWNER_RECORD_WAIT_SECS
        while True:
            try:
                owner: dict | None = self._read_owner()
            except (OSError, ValueError):
                owner = None
            if owner is not None and _alive(owner):
                return _describe(owner)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if owner is None:
            return f"pid and host unknown: {self.owner_path} is missing or unreadable"
        return (f"pid and host unknown: the new holder has not recorded itself yet, and {self.owner_path} "
                f"still names pid {owner.get('pid')} on host {owner.get('host')}, which is no longer running")


def _alive(owner: dict) -> bool:
    """Whether the recorded owner may be running (a process on another host is assumed to be)."""
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname():
        return True
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(owner: dict) -> str:
    since = owner.get("since")
    when = (f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
            if isinstance(since, (int, float)) else "")
    return f"pid {owner.get('pid')} on host {owner.get('host')}{when}"
