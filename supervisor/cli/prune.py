"""``prune LOGDIR --keep N [--dry-run]``: delete all but the N newest checkpoints the index lists.

Like retention (SPEC §5.5) it only touches checkpoints listed in the index's
``all_model_checkpoint_paths``: hand-copied checkpoints and those kept for good by
``keep_checkpoint_every_n_hours`` are never deleted, nor is the one ``model_checkpoint_path``
names (a restart restores it). The index is rewritten atomically first, then each checkpoint is
renamed aside and deleted, so a reader sees a whole checkpoint or none. ``--dry-run`` prints
the plan and deletes nothing (it takes no lock, so it also works while training runs); a real
prune is refused (exit 1) while a writer holds the logdir's lock.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace

from supervisor.checkpoint.commit import remove_checkpoint
from supervisor.checkpoint.format import step_of
from supervisor.checkpoint.index import CheckpointState, read_index, relative_index, write_index
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, Refused, error, writer_lock

__all__ = ["add_parser", "run", "plan", "drop_from_index"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prune", help="delete all but the N newest indexed checkpoints",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("logdir", metavar="LOGDIR")
    p.add_argument("--keep", metavar="N", type=_positive, required=True, help="how many checkpoints to keep (>= 1)")
    p.add_argument("--dry-run", action="store_true", help="print what would be deleted; delete nothing")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--keep must be a positive integer such as 3, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.logdir):
        error(f"{args.logdir} is not a directory")
        return EXIT_PROBLEM
    if args.dry_run:
        return _prune(args)
    try:
        with writer_lock(args.logdir):
            return _prune(args)
    except Refused as e:
        error(str(e))
        return EXIT_PROBLEM


def plan(index: CheckpointState, keep: int) -> tuple[list[str], list[str]]:
    """``(kept, deleted)`` names: the ``keep`` highest-step listed checkpoints and the indexed one stay."""
    listed = list(index.all_model_checkpoint_paths)
    by_step = sorted(listed, key=lambda n: (_step(n), listed.index(n)))
    kept = set(by_step[-keep:]) | {os.path.normpath(index.model_checkpoint_path)}
    return [n for n in listed if n in kept], [n for n in listed if n not in kept]


def _step(name: str) -> int:
    base = os.path.basename(name).rsplit("-", 1)[0]
    step = step_of(os.path.basename(name), base)
    return -1 if step is None else step


def drop_from_index(logdir: str, index: CheckpointState, names: list[str]) -> int:
    """Rewrites the index without ``names`` (atomically), then deletes them; returns how many
    could not be deleted."""
    keep = [(p, t) for p, t in _with_times(index) if p not in names]
    timed = len(index.all_model_checkpoint_timestamps) == len(index.all_model_checkpoint_paths)
    write_index(logdir, replace(index, all_model_checkpoint_paths=tuple(p for p, _ in keep),
                                all_model_checkpoint_timestamps=tuple(t for _, t in keep) if timed else ()))
    failures = 0
    for name in names:
        try:
            removed = remove_checkpoint(os.path.join(logdir, name))
        except OSError as e:
            error(f"could not delete {name}: {e}")
            failures += 1
            continue
        print(f"deleted {name}" if removed else f"{name} was already gone")
    return failures


def _with_times(index: CheckpointState) -> list[tuple[str, float]]:
    stamps = index.all_model_checkpoint_timestamps
    if len(stamps) != len(index.all_model_checkpoint_paths):
        stamps = (0.0,) * len(index.all_model_checkpoint_paths)
    return list(zip(index.all_model_checkpoint_paths, stamps))


def _prune(args: argparse.Namespace) -> int:
    try:
        index = read_index(args.logdir)
    except (ValueError, OSError) as e:
        error(f"{e}; prune only deletes checkpoints a readable index lists, so it deletes nothing")
        return EXIT_PROBLEM
    if index is None:
        error(f"{args.logdir} has no checkpoint index; prune only deletes checkpoints the index lists")
        return EXIT_PROBLEM
    index = relative_index(index, os.path.abspath(args.logdir))
    kept, deleted = plan(index, args.keep)
    print(f"keeping {len(kept)}: {', '.join(kept) or 'none'}")
    if not deleted:
        print("nothing to delete")
        return EXIT_OK
    if args.dry_run:
        print(f"would delete {len(deleted)}: {', '.join(deleted)} (dry run: nothing deleted)")
        return EXIT_OK
    return EXIT_PROBLEM if drop_from_index(args.logdir, index, deleted) else EXIT_OK
