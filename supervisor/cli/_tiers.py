"""``--local-dir``: the CLI's view of checkpoint tiers (SPEC §17).

``ls``, ``verify`` and ``inspect`` of a logdir take the node-local tier's directory (a session's
``local_dir=``) with ``--local-dir DIR``: ``ls`` lists both tiers (``--json``: every row with a
``tier``, ``"persistent"`` or ``"local"``) and says which checkpoint a restart on this node
restores, ``verify`` checks the checkpoints of both, ``inspect LOGDIR`` inspects that checkpoint.
A restart restores the newest checkpoint that verifies in either tier, each tier's candidates
being its index's choice and the older ones (`restore_choice`).
"""
from __future__ import annotations

import argparse
import os

from supervisor.cli._common import CheckpointRow, Listing, scan_logdir

__all__ = ["add_local_dir", "local_listing", "restore_choice", "tier_rows_json", "restore_line"]


def add_local_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--local-dir", metavar="DIR", default=None,
                        help="the node-local checkpoint tier (a session's local_dir=): show both tiers")


def local_listing(args: argparse.Namespace, *, basename: str | None = None, verify: str = "full") -> Listing | None:
    """The local tier's listing when ``--local-dir`` was given (None otherwise)."""
    if getattr(args, "local_dir", None) is None:
        return None
    return scan_logdir(os.path.abspath(args.local_dir), basename=basename, verify=verify)


def _tier_choice(rows: list[CheckpointRow]) -> CheckpointRow | None:
    named = next((r for r in rows if r.indexed), None)
    ceiling = named.step if named is not None and named.step is not None else None
    usable = [r for r in rows if r.verified and r.step is not None and (ceiling is None or r.step <= ceiling)]
    return max(usable, key=lambda r: r.step, default=None)


def restore_choice(persistent: Listing, local: Listing) -> tuple[str, CheckpointRow] | None:
    """``(tier, row)`` a restart on this node restores: the newer of each tier's choice (the local
    tier on a tie); None when neither tier has a checkpoint that verifies."""
    choices = [(tier, row) for tier, row in (("local", _tier_choice(local.rows)),
                                              ("persistent", _tier_choice(persistent.rows))) if row is not None]
    return max(choices, key=lambda c: c[1].step, default=None)  # max keeps the first (local) on a tie


def restore_line(persistent: Listing, local: Listing) -> str:
    choice = restore_choice(persistent, local)
    if choice is None:
        return "a restart on this node starts from scratch: neither tier has a checkpoint that verifies"
    tier, row = choice
    return f"a restart on this node restores step {row.step} from the {tier} tier ({row.path})"


def tier_rows_json(persistent: Listing, local: Listing) -> list[dict]:
    return [dict(r.to_json(), tier="persistent") for r in persistent.rows] + \
        [dict(r.to_json(), tier="local") for r in local.rows]
