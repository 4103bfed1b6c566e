"""The checkpoint-tier arguments (SPEC §17), checked at a front door's construction.

``local_dir`` (None: one tier, as before), ``persist_every_steps`` / ``persist_every_secs``
(TensorFlow's pair rule: give one; both left None with a ``local_dir``: every
`DEFAULT_PERSIST_SECS` seconds, what a remote save cadence is today), ``local_max_to_keep``
(default 2) and ``persist_grace_secs`` (how long closing waits for the final copy; None: until
it is done). Messages name the argument, the value and the fix.
"""
from __future__ import annotations

import os
from typing import Any

from supervisor import _validate as v
from supervisor.checkpoint.storage import is_url

__all__ = ["DEFAULT_PERSIST_SECS", "TIER_ARGUMENTS", "check_peer_replicas", "check_tiers"]

#: How often a local checkpoint is persisted when neither interval is given.
DEFAULT_PERSIST_SECS = 600.0
#: The front doors' tier arguments, as `check_tiers` takes and returns them.
TIER_ARGUMENTS = ("local_dir", "persist_every_steps", "persist_every_secs", "local_max_to_keep", "persist_grace_secs")


def check_tiers(*, local_dir: Any, persist_every_steps: Any = None, persist_every_secs: Any = None,
                local_max_to_keep: Any = 2, persist_grace_secs: Any = 120.0, logdir: str | None = None) -> dict[str, Any]:
    """The tier options as a dict of `TIER_ARGUMENTS` (``local_dir`` absolute, the interval pair
    resolved); ``logdir``: the checked checkpoint directory, which ``local_dir`` may not be or be in.

    Raises:
        ValueError, TypeError: a bad value (the message says which and what to pass instead).
    """
    steps = v.check_int("persist_every_steps", persist_every_steps, minimum=1, allow_none=True)
    secs = v.check_number("persist_every_secs", persist_every_secs, strictly_positive=True, allow_none=True)
    grace = v.check_number("persist_grace_secs", persist_grace_secs, minimum=0, allow_none=True)
    keep = v.check_int("local_max_to_keep", local_max_to_keep, minimum=1, allow_none=True)
    if local_dir is None:
        if steps is not None or secs is not None:
            raise ValueError("persist_every_steps/persist_every_secs were given without local_dir: they say how "
                             "often the node-local tier is copied to the logdir; pass local_dir='/dev/shm/<run>' (or a "
                             "local disk) to save there, or drop them")
        return dict.fromkeys(TIER_ARGUMENTS) | {"local_max_to_keep": keep, "persist_grace_secs": grace}
    if steps is not None and secs is not None:
        raise ValueError(f"give either persist_every_steps or persist_every_secs, not both (got {steps!r} and "
                         f"{secs!r}); set the other to None")
    return {"local_dir": _check_local_dir(local_dir, logdir), "persist_every_steps": steps,
            "persist_every_secs": DEFAULT_PERSIST_SECS if steps is None and secs is None else secs,
            "local_max_to_keep": keep, "persist_grace_secs": grace}


def check_peer_replicas(peer_replicas: Any, *, local_dir: Any, checkpoint_format: str) -> bool:
    """``peer_replicas`` checked against the other arguments: a bool, and True only with a
    ``local_dir`` and ``checkpoint_format="dcp"`` (each rank's part is replicated on a rank of
    another node: `supervisor.checkpoint.tiers.peers`)."""
    value = v.check_bool("peer_replicas", peer_replicas)
    if value and local_dir is None:
        raise ValueError("peer_replicas=True was given without local_dir: the replicas are copies of the node-local "
                         "tier's parts; pass local_dir='/dev/shm/<run>' (or a local disk), or drop peer_replicas")
    if value and checkpoint_format != "dcp":
        raise ValueError(f"peer_replicas=True needs checkpoint_format='dcp' (every rank's own part, replicated on "
                         f"another node), got checkpoint_format={checkpoint_format!r}: with replicated state only the "
                         "chief saves and a lost node resumes from the logdir; pass checkpoint_format='dcp' or drop "
                         "peer_replicas")
    return value


def _check_local_dir(local_dir: Any, logdir: str | None) -> str:
    path = v.check_path("local_dir", local_dir)
    if is_url(path) and not path.startswith("file://"):
        raise ValueError(f"local_dir must be a node-local path (a local disk, tmpfs or /dev/shm), got {path!r}; the "
                         "logdir (checkpoint_dir) is where the persistent copies go, so put the URL there")
    path = os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"local_dir {path!r} exists and is not a directory; choose a directory")
    if logdir is not None and not is_url(logdir):
        here, there = os.path.realpath(path), os.path.realpath(logdir)
        if here == there or here.startswith(there + os.sep) or there.startswith(here + os.sep):
            raise ValueError(f"local_dir {path!r} and the logdir {logdir!r} must be separate directories, neither "
                             "inside the other (each tier keeps its own index and retention); choose a local_dir "
                             "elsewhere, e.g. /dev/shm/<run> or a local disk")
    return path
