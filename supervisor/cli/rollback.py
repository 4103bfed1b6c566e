"""``rollback LOGDIR STEP``: point the index at an older checkpoint, so a restart resumes there.

The checkpoint must verify (sizes and checksums). The index is rewritten atomically (temp
file, fsync, rename) with ``model_checkpoint_path`` naming it — the hand edit SPEC §5.3 allows,
done safely. Newer checkpoints stay on disk and in the index: the resumed run replaces each one
(atomically) when it saves that step again; ``--discard-newer`` deletes them instead (only those
the index lists, after the index no longer names them, and only committed checkpoints of the run's
basename: `supervisor.checkpoint.save.commit.deletable_problem`, the rule every deleter applies). Refused (exit 1)
while a writer holds the logdir's lock; the lock is held while the index is rewritten.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace

from supervisor.checkpoint import CheckpointState, read_index, relative_index, write_index
from supervisor.checkpoint.storage import Storage
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, CheckpointRow, Listing, Refused, check_one, error, \
    scan_logdir, writer_lock
from supervisor.cli._remote import (add_storage_options, check_url, is_url, mutate_url,
                                    relative_url_index, scan)
from supervisor.cli.prune import drop_from_index

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rollback", help="point the index at an older checkpoint (atomically)",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("logdir", metavar="LOGDIR")
    p.add_argument("step", metavar="STEP", type=_step)
    p.add_argument("--discard-newer", action="store_true",
                   help="also delete the indexed checkpoints newer than STEP (after rewriting the index)")
    p.add_argument("--basename", default=None, help="checkpoint name prefix (default: from the index, else model.ckpt)")
    add_storage_options(p)


def _step(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"STEP must be a non-negative integer such as 1200, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    if is_url(args.logdir):
        return _run_url(args)
    if not os.path.isdir(args.logdir):
        error(f"{args.logdir} is not a directory")
        return EXIT_PROBLEM
    try:
        with writer_lock(args.logdir):
            return _rollback(args, args.logdir)
    except Refused as e:
        error(str(e))
        return EXIT_PROBLEM


def _run_url(args: argparse.Namespace) -> int:
    """``rollback s3://...``: the same, under the logdir's lease (a live one refuses it)."""
    return mutate_url(args, "rollback", lambda storage, url: _rollback(args, url, storage))


def _present(listing: Listing, logdir: str, storage: Storage | None) -> list[CheckpointRow]:
    """The checkpoints that exist directly inside the logdir (§5.3: relative paths)."""
    if storage is not None:
        return [r for r in listing.rows if not (r.reason or "").endswith("does not exist")]
    inside = os.path.abspath(logdir)
    return [r for r in listing.rows if os.path.isdir(r.path) and os.path.dirname(r.path) == inside]


def _rollback(args: argparse.Namespace, logdir: str, storage: Storage | None = None) -> int:
    mode = "size"
    listing = scan_logdir(logdir, basename=args.basename, verify=mode) if storage is None else \
        scan(storage, logdir, basename=args.basename, verify=mode)
    present = _present(listing, logdir, storage)
    target = next((r for r in present if r.step == args.step and (
        args.basename is None or r.name == f"{args.basename}-{args.step}")), None)
    if target is None:
        if args.basename is not None:  # --basename is honoured: only <basename>-<STEP> is a target
            error(f"{args.logdir} has no checkpoint named {args.basename}-{args.step} (checkpoints present: "
                  f"{', '.join(r.name for r in present) or 'none'})")
            return EXIT_PROBLEM
        steps = [r.step for r in present]
        error(f"{args.logdir} has no checkpoint of step {args.step} (steps present: {steps or 'none'})")
        return EXIT_PROBLEM
    target = check_one(target.path, basename=listing.basename, verify="full") if storage is None else \
        check_url(storage, logdir, target.name, basename=listing.basename, verify="full")
    if not target.verified:
        error(f"refusing to roll back to {target.path}: it fails verification: {target.reason}")
        return EXIT_PROBLEM
    exists = (lambda r: os.path.isdir(r.path)) if storage is None else (lambda r: r in present)  # noqa: E731
    newer = [r.name for r in listing.rows if r.step is not None and r.step > args.step and exists(r)]
    return _point_at(args, logdir, storage, target, newer, listing.basename)


def _point_at(args: argparse.Namespace, logdir: str, storage: Storage | None, target: CheckpointRow,
              newer: list[str], basename: str) -> int:
    """Rewrites the index to name ``target``; deletes the newer ones with ``--discard-newer``."""
    try:
        index = read_index(logdir, storage)
    except (ValueError, OSError) as e:
        print(f"the old index is unusable ({e}); writing a new one naming only {target.name}")
        index = None
    previous = index.model_checkpoint_path if index is not None else None
    # Without a usable index the new one lists only the target, so retention deletes nothing else.
    new = replace(index, model_checkpoint_path=target.name) if index is not None else \
        CheckpointState(target.name, (target.name,), ())
    write_index(logdir, new, storage)
    print(f"the index of {args.logdir} now points at {target.name} (was {previous or 'no index'}); "
          f"a restart resumes at step {args.step}")
    if newer and args.discard_newer and index is not None:
        relative = relative_index(new, os.path.abspath(logdir)) if storage is None else \
            relative_url_index(logdir, new)
        listed = set(relative.all_model_checkpoint_paths)
        return EXIT_PROBLEM if drop_from_index(logdir, relative, [n for n in newer if n in listed],
                                               basename=basename, storage=storage) else EXIT_OK
    if newer:
        print(f"newer checkpoints kept: {', '.join(newer)} (a resumed run replaces each when it saves that "
              "step again; `rollback --discard-newer` deletes them)")
    return EXIT_OK
