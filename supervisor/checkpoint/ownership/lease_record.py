"""The lease's record (one generation, JSON, untrusted when read) and its errors and messages
(`supervisor.checkpoint.ownership.lease`)."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from supervisor.checkpoint.ownership.holder import gone_reason, on_this_machine
from supervisor.checkpoint.storage.records import fields, parse_object
from supervisor.errors import CheckpointError, LogdirInUseError

__all__ = ["LeaseLostError", "LeaseRecord", "in_use_message", "when"]


class LeaseLostError(LogdirInUseError, CheckpointError):
    """This writer's lease was overtaken, could not be renewed or ran out: it must not commit.

    Also a `CheckpointError`: it is how a save of a writer that lost the logdir fails (the
    managers call `Lease.check` right before each commit), and the save-failure paths (a
    session's ``on_error``, ``close``) carry checkpoint errors."""


@dataclass(frozen=True)
class LeaseRecord:
    """One generation of the lease (the JSON content of its object)."""

    generation: int
    owner_id: str
    host: str
    pid: int
    acquired_at: float
    expires_at: float
    lease_secs: float
    released: bool = False
    boot_id: str = ""  # the holder's machine and process, to tell that it is gone (holder.py)
    pid_ns: str = ""
    started: int | None = None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}"

    def gone(self) -> str | None:
        """Why its holder certainly no longer runs (`holder.gone_reason`), else None."""
        return gone_reason(host=self.host, pid=self.pid, boot_id=self.boot_id, pid_ns=self.pid_ns,
                           started=self.started)

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        """Parses a lease record (untrusted: `supervisor.checkpoint.storage.records`); `ValueError` says why."""
        raw = parse_object(data)
        return fields(lambda: cls(
            generation=int(raw["generation"]), owner_id=str(raw["owner_id"]), host=str(raw["host"]),
            pid=int(raw["pid"]), acquired_at=float(raw["acquired_at"]), expires_at=float(raw["expires_at"]),
            lease_secs=float(raw["lease_secs"]), released=bool(raw.get("released", False)),
            boot_id=str(raw.get("boot_id", "")), pid_ns=str(raw.get("pid_ns", "")),
            started=None if raw.get("started") is None else int(raw["started"])), "lease record")


def in_use_message(directory: str, path: str, holder: LeaseRecord, now: float) -> str:
    """The refusal of a live lease: its holder, its expiry, and how to take the logdir over."""
    here = on_this_machine(host=holder.host, boot_id=holder.boot_id, pid_ns=holder.pid_ns)
    how = (f"it runs on this host: stop it (kill {holder.pid}) and start this run again, which takes the lease "
           "over at once" if here else
           f"this host cannot see whether it still runs: stop it on {holder.host}, then start this run again "
           f"at {when(holder.expires_at)} or later, when its unrenewed lease has expired")
    return (f"the logdir {directory} is in use by another writer ({holder.describe()}, since "
            f"{when(holder.acquired_at)}); its lease ({path}) expires at {when(holder.expires_at)}, "
            f"in {holder.expires_at - now:.0f} s unless renewed. To take the logdir over, {how}; or give this "
            "run another logdir")


def when(timestamp: float) -> str:
    """A wall-clock time as a reader of a refusal wants it, and as the lease records it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)) + f" (t={timestamp:.1f})"
