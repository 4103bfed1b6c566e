"""``--local-dir``: the CLI's view of checkpoint tiers (SPEC §17).

``ls``, ``verify`` and ``inspect`` of a logdir take the node-local tier's directory (a session's
``local_dir=``) with ``--local-dir DIR``: ``ls`` lists both tiers (``--json``: every row with a
``tier``, ``"persistent"`` or ``"local"``) and says which checkpoint a restart on this node
restores, ``verify`` checks the checkpoints of both, ``inspect LOGDIR`` inspects that checkpoint.
A restart restores the newest checkpoint that verifies in either tier, each tier's candidates
being its index's choice and the older ones (`restore_choice`). A sharded local tier
(``checkpoint_format="dcp"``: ``rank-<r>/`` directories of parts) is listed part by part and
grouped by step (`supervisor.cli._sharded_tier`).
"""
from __future__ import annotations

import argparse
import os
from typing import Callable

from supervisor.cli._common import CheckpointRow, Listing, scan_logdir
from supervisor.cli._sharded_tier import ShardedListing, by_replica, part_of, peer_dirs, rank_dirs, render_sharded, \
    sharded_listing, sharded_restore

__all__ = ["add_local_dir", "local_listing", "render_local", "restore_choice", "tier_rows_json", "restore_line"]


def add_local_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--local-dir", metavar="DIR", default=None,
                        help="the node-local checkpoint tier (a session's local_dir=): show both tiers")


def local_listing(args: argparse.Namespace, *, basename: str | None = None, verify: str = "full") -> Listing | None:
    """The local tier's listing when ``--local-dir`` was given (None otherwise)."""
    if getattr(args, "local_dir", None) is None:
        return None
    local_dir = os.path.abspath(args.local_dir)
    ranks = rank_dirs(local_dir)
    if ranks or peer_dirs(local_dir):  # checkpoint_format="dcp": a part per rank (and peer replicas)
        return sharded_listing(local_dir, ranks, basename=basename, verify=verify)
    return scan_logdir(local_dir, basename=basename, verify=verify)


def render_local(local: Listing, render: Callable[[Listing, str], str]) -> str:
    """The local tier's human listing (``render``: ``ls``'s, for a replicated tier)."""
    return render_sharded(local) if isinstance(local, ShardedListing) else "local tier: " + render(local, "")


def _tier_choice(rows: list[CheckpointRow]) -> CheckpointRow | None:
    named = next((r for r in rows if r.indexed), None)
    ceiling = named.step if named is not None and named.step is not None else None
    usable = [r for r in rows if r.verified and r.step is not None and (ceiling is None or r.step <= ceiling)]
    return max(usable, key=lambda r: r.step, default=None)


def restore_choice(persistent: Listing, local: Listing) -> tuple[str, CheckpointRow] | None:
    """``(tier, row)`` a restart on this node restores: the newer of each tier's choice (the local
    tier on a tie); None when neither tier has a checkpoint that verifies. Of a sharded local
    tier, the row is the lowest seen rank's part of the step."""
    if isinstance(local, ShardedListing):
        persistent_row = _tier_choice(persistent.rows)
        tier, step, _ = sharded_restore(persistent_row.step if persistent_row is not None else None, local)
        row = part_of(local, step) if tier == "local" and step is not None else persistent_row
        return None if row is None else (tier, row)
    choices = [(tier, row) for tier, row in (("local", _tier_choice(local.rows)),
                                              ("persistent", _tier_choice(persistent.rows))) if row is not None]
    return max(choices, key=lambda c: c[1].step, default=None)  # max keeps the first (local) on a tie


def restore_line(persistent: Listing, local: Listing) -> str:
    if isinstance(local, ShardedListing):
        return _sharded_line(persistent, local)
    choice = restore_choice(persistent, local)
    if choice is None:
        return "a restart on this node starts from scratch: neither tier has a checkpoint that verifies"
    tier, row = choice
    return f"a restart on this node restores step {row.step} from the {tier} tier ({row.path})"


def tier_rows_json(persistent: Listing, local: Listing) -> list[dict]:
    return [dict(r.to_json(), tier="persistent") for r in persistent.rows] + \
        [dict(r.to_json(), tier="local") for r in local.rows]


def _sharded_line(persistent: Listing, local: ShardedListing) -> str:
    row = _tier_choice(persistent.rows)
    tier, step, unseen = sharded_restore(row.step if row is not None else None, local)
    if tier == "local":
        replicas = by_replica(local, step)  # type: ignore[arg-type]
        if replicas:
            note = f"; rank{'s' if len(replicas) > 1 else ''} {', '.join(map(str, replicas))} by their peer replicas here"
        else:
            note = ""
        if not unseen:
            return (f"a restart restores step {step} from the local tiers (every rank holds a committed part that "
                    f"verifies{note})")
        fallback = f"the logdir's step {row.step}" if row is not None else "the logdir's newest"
        return (f"a restart restores step {step} from the local tiers if rank(s) {', '.join(map(str, unseen))} "
                f"(not in {local.logdir}) hold it too; else {fallback}")
    if row is None:
        return "a restart starts from scratch: neither tier has a checkpoint that verifies"
    return (f"a restart restores step {step} from the persistent tier ({row.path}): no step newer than it is held "
            "by every rank's local tier")
