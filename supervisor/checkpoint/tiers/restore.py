"""Restoring from checkpoint tiers (SPEC §17): the newest checkpoint that verifies in either tier.

`find_in_tiers` merges each tier's candidates (`supervisor.checkpoint.load.choose.candidates`: the
tier's index choice, then its older committed checkpoints) newest step first — the local tier
first on a tie, it is the faster read — and loads the first that verifies, through its tier's
`Storage`. A candidate that fails verification (or vanished) is skipped with a WARNING naming
its tier and the reason, and the next older one of either tier is tried; if checkpoints exist
and none is usable, `CheckpointCorruptError` lists each and why (never a silent fresh start).
`describe` words the INFO line of the restore (which tier, and why not the other).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.load.choose import candidates
from supervisor.checkpoint.layout.fencing import OrphanedManifestError
from supervisor.checkpoint.layout.format import step_of
from supervisor.checkpoint.load.loader import LoadedCheckpoint, load_verified
from supervisor.checkpoint.storage import Storage
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError, CheckpointVanishedError

__all__ = ["Tier", "TierChoice", "describe", "find_in_tiers"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tier:
    """One tier: its name in messages (``"local"``, ``"persistent"``), directory and storage."""

    name: str
    directory: str
    storage: Storage


@dataclass(frozen=True)
class TierChoice:
    """What `find_in_tiers` loaded, from which tier, and each tier's newest candidate step."""

    loaded: LoadedCheckpoint
    tier: Tier
    newest: dict[str, int | None]


def find_in_tiers(tiers: Iterable[Tier], basename: str, *, verify: str = "full", unpickling: Unpickling = Unpickling(),
                  keep_copy: bool = False) -> TierChoice | None:
    """Loads the newest checkpoint that verifies in any of ``tiers`` (see the module docstring);
    None when no tier has a checkpoint. ``unpickling``: the restorer's allow-list (one record).

    Raises:
        CheckpointCorruptError: checkpoints exist but none verifies (each listed with why).
        CheckpointError: a verified checkpoint needs an untrusted global.
    """
    tiers = tuple(tiers)
    merged, newest = [], {}
    for rank, tier in enumerate(tiers):
        paths = candidates(tier.directory, basename, tier.storage)
        steps = [step_of(tier.storage.basename(p), basename) or 0 for p in paths]
        newest[tier.name] = steps[0] if steps else None
        merged += [(step, -rank, path, tier) for step, path in zip(steps, paths)]
    merged.sort(key=lambda item: item[:2], reverse=True)
    failures: dict[str, str] = {}
    for i, (step, _, path, tier) in enumerate(merged):
        try:
            loaded = load_verified(path, verify=verify, unpickling=unpickling, mmap=True, storage=tier.storage,
                                   keep_copy=keep_copy)
            return TierChoice(loaded, tier, newest)
        except OrphanedManifestError as e:
            logger.warning("passing over %s", e)
        except (CheckpointNotFoundError, CheckpointCorruptError, CheckpointVanishedError) as e:
            failures[path] = reason = str(e)
            nxt = "trying the next older one of either tier" if i + 1 < len(merged) else "no older checkpoint left"
            logger.warning("skipping checkpoint %s of the %s tier (step %d): %s; %s", path, tier.name, step, reason, nxt)
    if not failures:
        return None
    listing = "; ".join(f"{p}: {r}" for p, r in failures.items())
    raise CheckpointCorruptError(
        f"none of the {len(failures)} checkpoint(s) of the tiers ({', '.join(t.directory for t in tiers)}) can be "
        f"restored ({listing}). Refusing to start from scratch over them: repair or move them away")


def describe(choice: TierChoice) -> str:
    """The restore's INFO line: the step, the tier it came from and why not the other tier."""
    step, tier = choice.loaded.step, choice.tier
    others = [(name, s) for name, s in choice.newest.items() if name != tier.name]
    if not others:
        return f"restored step {step} from the {tier.name} tier {tier.directory}"
    name, other = others[0]
    owner = "the logdir" if name == "persistent" else f"the {name} tier"
    if other is None:
        why = f"{owner} has no checkpoint" + (" (a new or wiped node?)" if name == "local" else " yet")
    elif other > step:
        why = f"{owner}'s step {other} did not verify"
    elif other < step:
        why = f"newer than {owner}'s step {other}"
    else:
        why = f"{owner} holds the same step"
    return f"restored step {step} from the {tier.name} tier {tier.directory} ({why})"
