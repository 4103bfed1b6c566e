"""The logdir's single-writer lock (SPEC §5.6, §16): ``lock="flock"`` or ``lock="lease"``.

`acquire_writer_lock` is what a writer calls: it returns a held `WriterLock` —
`OwnershipLock` (an OS file lock, the default on local paths) or a `Lease` (exclusive lease
files renewed by a thread, the default on object stores; see lease.py). The writer calls
``check()`` right before each commit: a lease that was lost raises `LeaseLostError` there, so
a writer that lost the logdir never commits.

The two kinds refuse each other on a local path: a flock writer is refused while a live lease
exists, and a lease writer takes the flock (where the filesystem grants one) while it creates
its lease, so it is refused by a flock writer on its node. The CLI's mutations take the
`OwnershipLock`, so they are refused by either kind of writer.

The flock:

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

from typing import Any, Protocol, runtime_checkable

import filelock

from supervisor._validate import check_lock
from supervisor.checkpoint.storage.fileio import open_regular_file
from supervisor.checkpoint.ownership.lease import DEFAULT_LEASE_SECS, Lease
from supervisor.checkpoint.storage.local import LocalStorage
from supervisor.checkpoint.storage.records import parse_object
from supervisor.checkpoint.storage.base import Storage
from supervisor.clock import Clock
from supervisor.errors import CheckpointError, LogdirInUseError

__all__ = ["OwnershipLock", "OWNER_FILE", "OWNER_RECORD_WAIT_SECS", "WriterLock", "acquire_writer_lock",
           "read_owner_record", "resolve_lock_kind", "LOCK_FILE"]

logger = logging.getLogger(__name__)

#: The flock file of a local logdir (``lock="flock"``).
LOCK_FILE = ".supervisor.lock"
OWNER_FILE = LOCK_FILE + ".owner"
#: How long a refused writer waits for the new holder to record itself (see the module docstring).
OWNER_RECORD_WAIT_SECS = 2.0
_OWNER_MAX_BYTES = 1 << 16  # a pid, a host and a time: a larger file is damaged, never read whole


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

    def check(self) -> None:
        """Raises `LogdirInUseError` unless this process holds the lock (the kernel keeps a
        flock for as long as the process lives: once taken, it is never lost)."""
        if not self._lock.is_locked:
            raise LogdirInUseError(f"this process does not hold the ownership lock {self.path} of the logdir "
                                   f"{self.directory}; it must not commit there")

    def acquire(self) -> None:
        """Takes the lock or raises `LogdirInUseError` naming the holder's pid and host (a flock
        writer's, or a lease writer's while its lease is live)."""
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
            self._refuse_a_live_lease()
        except BaseException:
            self._lock.release()
            raise
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

    def _refuse_a_live_lease(self) -> None:
        """A ``lock="lease"`` writer holds no flock between commits: its live lease refuses us."""
        lease = Lease(_LOCAL, self.directory)
        try:
            holder = lease.live_holder()
        except OSError as e:
            logger.warning("could not read the lease records of %s (%s); relying on the flock alone", self.directory, e)
            return
        if holder is not None:
            raise lease.in_use_error(holder)

    def _write_owner(self) -> None:
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        tmp = f"{self.owner_path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(owner, f)
        os.replace(tmp, self.owner_path)

    def _read_owner(self) -> dict:
        """The owner record (untrusted: `read_owner_record`); `OSError` or `ValueError`."""
        return read_owner_record(self.owner_path)

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


_LOCAL = LocalStorage()


@runtime_checkable
class WriterLock(Protocol):
    """A held single-writer lock, as `acquire_writer_lock` returns it."""

    @property
    def held(self) -> bool: ...

    def check(self) -> None:
        """Raises `LogdirInUseError` (`LeaseLostError` for a lease) unless this writer may
        still commit; the managers call it right before each commit."""

    def release(self) -> None: ...


def resolve_lock_kind(storage: Storage, kind: str) -> str:
    """``"flock"`` or ``"lease"``: ``"auto"`` is ``"flock"`` on a local path, ``"lease"`` elsewhere."""
    if kind == "auto":
        return "lease" if storage.is_object_store else "flock"
    return kind


def acquire_writer_lock(storage: Storage, directory: str, *, kind: str = "auto", lease_secs: float | None = None,
                        clock: Clock | None = None) -> WriterLock:
    """Takes the single-writer lock of ``directory`` and returns it held.

    Args:
        storage: the storage ``directory`` is on (`supervisor.checkpoint.storage.storage_for`).
        directory: the logdir, in the storage's spelling.
        kind: ``"flock"``: an OS file lock (local paths only; the kernel releases it when the
            process dies). ``"lease"``: a lease renewed every ``lease_secs / 3`` (any storage; on
            NFS and Lustre, whose flock may be node-local, the safe choice). ``"auto"``
            (default): ``"flock"`` on a local path, ``"lease"`` on an object store.
        lease_secs: how long a lease lives unrenewed (default 60 s; a dead writer's logdir is
            taken over only after that). Refused where a flock is taken (``"flock"``, ``"auto"`` locally).
        clock: the lease's clock (tests).

    Raises:
        LogdirInUseError: another live writer holds it (named, with its lease's expiry).
        ValueError: a bad ``kind``/``lease_secs``, or ``"flock"`` on an object store.
    """
    local = not storage.is_object_store
    kind, lease_secs = check_lock(kind, lease_secs, directory, object_store=not local)
    resolved = resolve_lock_kind(storage, kind)
    if resolved == "flock":
        if not local:
            raise ValueError(f"lock='flock' needs a local path, but the logdir {directory} is on an object store, "
                             "which has no file locks; use lock='lease' (or 'auto', which chooses it there)")
        lock = OwnershipLock(directory)
        lock.acquire()
        return lock
    lease = Lease(storage, directory, lease_secs=DEFAULT_LEASE_SECS if lease_secs is None else lease_secs,
                  clock=clock)
    guard = _flock_guard(directory) if local else None
    try:
        lease.acquire()
    finally:
        if guard is not None:
            guard.release()
    logger.debug("this process holds the lease of %s (lease_secs=%g, renewed every %.1f s)", directory,
                lease.lease_secs, lease.lease_secs / 3)
    return lease


def _flock_guard(directory: str) -> OwnershipLock | None:
    """The flock a lease writer holds while it creates its lease on a local path, so that a
    flock writer starting meanwhile sees one or the other; None where the filesystem grants no
    flock (e.g. ``ENOLCK`` on NFS without lockd): the lease alone guards it then."""
    guard = OwnershipLock(directory)
    try:
        guard.acquire()  # LogdirInUseError: a flock writer (or a live lease) holds the logdir
    except CheckpointError as e:
        logger.info("no flock on %s (%s); the lease alone guards it", directory, e)
        return None
    return guard


def read_owner_record(path: str) -> dict[str, Any]:
    """The lock's owner record at ``path``, parsed as the untrusted input it is
    (`supervisor.checkpoint.storage.records`): ``pid`` a positive integer (never 0 or -1, which signal
    more than one process), ``host`` a string, ``since`` a time or absent. `OSError` (missing,
    unreadable, not a regular file: a FIFO is refused, never waited on) or `ValueError`
    (damaged: why)."""
    with open_regular_file(path, "rb") as f:
        data = f.read(_OWNER_MAX_BYTES + 1)
    if len(data) > _OWNER_MAX_BYTES:
        raise ValueError(f"{path} has more than {_OWNER_MAX_BYTES} bytes: not an owner record")
    owner = parse_object(data)
    pid, host, since = owner.get("pid"), owner.get("host"), owner.get("since")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < 1 << 31 or not isinstance(host, str):
        raise ValueError(f"malformed owner record (pid {pid!r:.40}, host {host!r:.40})")
    if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float)) or not 0 <= since < 1e11):
        raise ValueError(f"malformed owner record (since {since!r:.40})")
    return owner


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
