"""Whether a lease holder recorded on this machine is still running (lease.py, issue 30 item 8).

A lease record names its holder's host, pid, the kernel's boot id
(``/proc/sys/kernel/random/boot_id``: new at every boot), its PID namespace
(``/proc/self/ns/pid``) and its process's start time (field 22 of ``/proc/<pid>/stat``, in clock
ticks since boot). A writer reading the record can then tell that the holder is **gone** — not
merely unrenewed — when all of these hold: the same host name, the same boot (so the pid and the
start time mean the same thing here), the same PID namespace (a container with its own pids
shares the host's boot id), and no process with that pid now, or one that started at another
time (the pid was reused). A killed holder can then be taken over at once instead of after
``lease_secs``. Anything else — another host, another boot, another namespace, a record without
these fields (an older writer), no ``/proc`` — says nothing: the lease's expiry decides.
"""
from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["gone_reason", "identity", "on_this_machine"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _boot_id() -> str:
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read(64).strip()
    except (OSError, ValueError):
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot); None when there is no such live
    process (a zombie is a dead one). Raises ``OSError`` when ``/proc`` cannot say."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read(4096)
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3
    if fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])  # field 22


def identity() -> dict[str, Any]:
    """This process's fields for its lease record: ``boot_id``, ``pid_ns``, ``started``
    (empty / None where the system does not say)."""
    try:
        started = _start_ticks(os.getpid())
    except (OSError, ValueError, IndexError):
        started = None
    return {"boot_id": _boot_id(), "pid_ns": _pid_namespace(), "started": started}


def on_this_machine(*, host: str, boot_id: str, pid_ns: str) -> bool:
    """Whether a holder so recorded runs on this host, in this boot and PID namespace (its pid
    means here what it meant there)."""
    return bool(boot_id and pid_ns) and host == socket.gethostname() and boot_id == _boot_id() \
        and pid_ns == _pid_namespace()


def gone_reason(*, host: str, pid: int, boot_id: str, pid_ns: str, started: int | None) -> str | None:
    """Why the recorded holder (``host``, ``pid``... as `identity` recorded them) is certainly
    not running any more, e.g. ``"pid 3582 no longer runs on this host (vm, same boot)"``; None
    when it may still run or this process cannot tell (see the module docstring)."""
    if pid <= 0 or not on_this_machine(host=host, boot_id=boot_id, pid_ns=pid_ns):
        return None
    try:
        now = _start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return None
    if now is None:
        return f"pid {pid} no longer runs on this host ({host}, same boot)"
    if started is not None and now != started:
        return f"pid {pid} on this host ({host}) is another process now (started at another time)"
    return None
