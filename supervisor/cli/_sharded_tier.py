"""``--local-dir`` of a sharded tier (SPEC §17): ``checkpoint_format="dcp"`` with a ``local_dir``.

Each rank keeps its own parts in ``<local_dir>/rank-<r>/`` (a one-process DCP checkpoint of its
shards per step, `supervisor.checkpoint.tiers.sharded_parts`), and a part is restorable only once
the chief's ``<name>.all-ranks`` mark sits next to it. The CLI lists one row per part (``rank``,
``committed``: the mark, ``world_size``: the job's, in ``--json``), verifies each, and groups
them by step for ``ls``: which ranks hold a committed part of it, and each failing part's reason.
A restart restores the newest step every rank holds a committed part of that verifies, when it is
at least the logdir's newest; else the logdir's. One node's ``local_dir`` holds its own ranks'
parts only: the line then says which ranks it could not see. With ``peer_replicas=True`` it also
keeps ``peer-<s>/``, the replicas of rank ``s``'s parts (a partner node's): listed as rows with
``replica`` true (``rank``: ``s``), in the REPLICAS column, and counted for rank ``s`` — a rank
restores from its own part or from its replica, as the ranks' agreement does.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from supervisor.checkpoint.layout.format import read_manifest
from supervisor.checkpoint.tiers.sharded_parts import ALL_RANKS
from supervisor.cli._common import CheckpointRow, Listing, format_age, format_bytes, scan_logdir, table

__all__ = ["PartRow", "ShardedListing", "by_replica", "part_of", "peer_dirs", "rank_dirs", "render_sharded", "sharded_listing", "sharded_restore"]

_RANK_DIR = re.compile(r"rank-(\d+)")
_PEER_DIR = re.compile(r"peer-(\d+)")


@dataclass
class PartRow(CheckpointRow):
    """One rank's part of a step in a sharded local tier (its ``--json`` object adds these)."""

    rank: int = 0
    committed: bool = False  # the chief's .all-ranks mark: restorable
    world_size: int | None = None  # of the job that saved it (its manifest)
    replica: bool = False  # a peer replica of rank ``rank``'s part (``peer-<rank>/``), kept for it here


@dataclass
class ShardedListing(Listing):
    """A sharded local tier: ``rows`` one `PartRow` per part, by step then rank."""

    ranks: list[int] = field(default_factory=list)  # the rank directories found
    replicas: list[int] = field(default_factory=list)  # the ranks whose peer replicas are kept here

    @property
    def world_size(self) -> int | None:
        return max((r.world_size for r in self.rows if r.world_size is not None), default=None)


def rank_dirs(local_dir: str, pattern: re.Pattern = _RANK_DIR) -> dict[int, str]:
    """``{rank: <local_dir>/rank-<rank>}`` of the rank directories in ``local_dir`` (empty: not
    sharded); with ``pattern=_PEER_DIR`` (`peer_dirs`) the ``peer-<rank>`` replica directories."""
    try:
        names = os.listdir(local_dir)
    except OSError:
        return {}
    found = {}
    for name in names:
        match = pattern.fullmatch(name)
        if match and os.path.isdir(os.path.join(local_dir, name)):
            found[int(match.group(1))] = os.path.join(local_dir, name)
    return found


def peer_dirs(local_dir: str) -> dict[int, str]:
    """``{rank: <local_dir>/peer-<rank>}``: the peer replicas of a partner node's ranks kept here."""
    return rank_dirs(local_dir, _PEER_DIR)


def sharded_listing(local_dir: str, ranks: dict[int, str], *, basename: str | None, verify: str) -> ShardedListing:
    """Every part of every rank directory, and every peer replica, verified (``verify``: "full" or "size")."""
    rows, name, peers = [], basename, peer_dirs(local_dir)
    for replica, dirs in ((False, ranks), (True, peers)):
        for rank, root in sorted(dirs.items()):
            listing = scan_logdir(root, basename=basename, verify=verify)
            name = listing.basename if listing.rows or name is None else name
            for row in listing.rows:
                rows.append(PartRow(**asdict(row), rank=rank, committed=os.path.exists(row.path + ALL_RANKS),
                                    world_size=_world_size(row.path), replica=replica))
    rows.sort(key=lambda r: (-1 if r.step is None else r.step, r.replica, r.rank))
    return ShardedListing(local_dir, name or "model.ckpt", None, None, rows, ranks=sorted(ranks), replicas=sorted(peers))


def _world_size(path: str) -> int | None:
    try:
        return read_manifest(path).world_size
    except Exception:  # noqa: BLE001 - a damaged part: its row says why
        return None


def _restorable(local: ShardedListing, *, replica: bool | None = None) -> dict[int, set[int]]:
    """``{rank: steps of its committed parts (own, or ``replica``: those kept for it here; None:
    either) that verify}``."""
    held: dict[int, set[int]] = {rank: set() for rank in local.ranks + local.replicas if replica is None or (
        rank in (local.replicas if replica else local.ranks))}
    for row in local.rows:
        if isinstance(row, PartRow) and row.committed and row.verified and row.step is not None and (
                replica is None or row.replica == replica):
            held[row.rank].add(row.step)
    return held


def sharded_restore(persistent_step: int | None, local: ShardedListing) -> tuple[str, int | None, list[int]]:
    """``(tier, step, unseen ranks)`` a restart restores: ``"local"`` with the newest step every
    rank seen holds, by its own part or a peer replica kept here (when at least ``persistent_step``;
    ``unseen``: the job's ranks not in this ``local_dir``, which must hold it too), else
    ``"persistent"`` (step None: nothing)."""
    held = _restorable(local)
    common = set.intersection(*held.values()) if held else set()
    world = local.world_size
    unseen = [r for r in range(world) if r not in held] if world is not None else []
    agreed = max(common, default=None)
    if agreed is not None and (persistent_step is None or agreed >= persistent_step):
        return "local", agreed, unseen
    return "persistent", persistent_step, unseen


def by_replica(local: ShardedListing, step: int) -> list[int]:
    """The ranks that restore ``step`` only by a peer replica kept here (no own part of it here)."""
    own, replicas = _restorable(local, replica=False), _restorable(local, replica=True)
    return [r for r, steps in sorted(replicas.items()) if step in steps and step not in own.get(r, set())]


def render_sharded(local: ShardedListing) -> str:
    """The human listing of a sharded local tier: one line per step, the ranks holding it (and,
    with peer replicas, the ranks whose replica of it is kept here)."""
    world = local.world_size
    ranks = ", ".join(map(str, local.ranks)) or "none"
    peers = f"; peer replicas of rank{'s' if len(local.replicas) > 1 else ''} {', '.join(map(str, local.replicas))}"
    lines = [f"local tier (sharded, a part per rank): {local.logdir}: rank director{'y' if len(local.ranks) == 1 else 'ies'} "
             f"{ranks}" + (f" of a {world}-rank job" if world is not None else "") + (peers if local.replicas else "")]
    steps = sorted({r.step for r in local.rows if r.step is not None})
    if not steps:
        return "\n".join(lines + ["(no parts)"])
    body = [_step_line(local, step) for step in steps]
    head = ["STEP", "NAME", "RANKS"] + (["REPLICAS"] if local.replicas else []) + ["SAVED", "SIZE", "STATUS"]
    lines.append(table(head, body, right=(0, len(head) - 2)))
    lines.append("(RANKS = the ranks holding a committed part that verifies" + (
        "; REPLICAS = the ranks whose committed peer replica that verifies is kept here" if local.replicas else "")
        + "; SIZE = all parts here)")
    return "\n".join(lines)


def _step_line(local: ShardedListing, step: int) -> list[str]:
    parts = [r for r in local.rows if r.step == step and isinstance(r, PartRow)]
    holding = [r.rank for r in parts if r.committed and r.verified and not r.replica]
    replicas = [r.rank for r in parts if r.committed and r.verified and r.replica]
    what = {False: "rank", True: "replica of rank"}
    problems = [f"{what[r.replica]} {r.rank}: FAILED: {r.reason}" for r in parts if not r.verified]
    problems += [f"{what[r.replica]} {r.rank}: not committed (no {ALL_RANKS} mark: never restored)"
                 for r in parts if r.verified and not r.committed]
    wall = max((r.wall_time for r in parts if r.wall_time is not None), default=None)
    name = next((r.name for r in parts if not r.replica), parts[0].name)
    return [str(step), name, ",".join(map(str, holding)) or "-"] + (
        [",".join(map(str, replicas)) or "-"] if local.replicas else []) + [
        format_age(wall), format_bytes(sum(r.bytes for r in parts)), "; ".join(problems) or "ok"]


def part_of(local: ShardedListing, step: int) -> CheckpointRow | None:
    """The lowest seen rank's part of ``step`` (what ``inspect`` shows of a sharded local step; a
    peer replica when no own part of it is here)."""
    rows = [r for r in local.rows if r.step == step and isinstance(r, PartRow) and r.committed]
    return next((r for r in rows if not r.replica), rows[0] if rows else None)
