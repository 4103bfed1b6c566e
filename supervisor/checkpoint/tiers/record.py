"""What the local tier knows of the logdir (SPEC §17): the step it last saw there, recorded.

A tiered session restores from the local tier without waiting for the logdir (its lock or lease,
index and listing: seconds on an object store) when the local tier can tell, by itself, that the
logdir holds nothing newer. It can because it records it: ``tier-persisted.json`` in
``local_dir`` names the logdir and the newest step the logdir held when this node last held its
writer lock — written when the persist worker opened the logdir, and after each copy it
published. While this node holds the lock nobody else writes the logdir, so a local checkpoint
at least as new as the recorded step is the newest of either tier unless another writer took the
logdir over since; the manager checks that in the background once it holds the lock again
(`supervisor.checkpoint.tiers.manager`), and when it happened stops the session and removes the
record, so the next start waits for the logdir.

A missing, unreadable or foreign record (another logdir) means "unknown": the restore waits for
the logdir and merges both tiers, as it always may.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from supervisor.checkpoint.storage import Storage

__all__ = ["RECORD_FILE", "read_record", "remove_record", "write_record"]

logger = logging.getLogger(__name__)

#: The local tier's record of the logdir's newest step (in ``local_dir``).
RECORD_FILE = "tier-persisted.json"


def read_record(storage: Storage, local_dir: str, logdir: str) -> tuple[bool, int | None]:
    """``(True, step)`` when ``local_dir`` records ``logdir``'s newest step (None: it had no
    checkpoint); ``(False, None)`` when it records nothing usable for that logdir."""
    try:
        record: Any = json.loads(storage.read_bytes(storage.join(local_dir, RECORD_FILE), max_bytes=1 << 16))
    except FileNotFoundError:
        return False, None
    except (OSError, ValueError) as e:
        logger.warning("ignoring the local tier's record %s (%s): the restore waits for the logdir",
                       storage.join(local_dir, RECORD_FILE), e)
        return False, None
    if not isinstance(record, dict) or record.get("logdir") != logdir:
        return False, None
    step = record.get("step")
    if not (step is None or (isinstance(step, int) and step >= 0)):
        return False, None
    return True, step


def write_record(storage: Storage, local_dir: str, logdir: str, step: int | None) -> None:
    """Records that ``logdir``'s newest step is ``step`` (atomically: a reader sees the old or the new)."""
    storage.write_atomic(storage.join(local_dir, RECORD_FILE), json.dumps({"logdir": logdir, "step": step}).encode())


def remove_record(storage: Storage, local_dir: str) -> None:
    """Forgets the record: the next restore waits for the logdir."""
    storage.remove(storage.join(local_dir, RECORD_FILE))
