"""``prune LOGDIR --keep N [--dry-run]``: delete all but the N newest checkpoints the index lists.

Like retention (SPEC §5.5) it only touches checkpoints listed in the index's
``all_model_checkpoint_paths``: hand-copied checkpoints and those kept for good by
``keep_checkpoint_every_n_hours`` are never deleted, nor is the one ``model_checkpoint_path``
names, nor the one a restart would restore (the index's choice if it verifies, else the next
older that does: `supervisor.checkpoint.load.choose.choose_checkpoint`, checksums included). The index
is rewritten atomically first, then each checkpoint is renamed aside and deleted, so a reader
sees a whole checkpoint or none. ``--dry-run`` prints the plan and deletes nothing (it takes no
lock, so it also works while training runs); a real prune is refused (exit 1) while a writer
holds the logdir's lock.

The index is untrusted: only entries that are checkpoints by the one rule every deleter applies
(`supervisor.checkpoint.save.commit.deletable_problem`: ``<basename>-<step>`` of the run's basename,
taken from ``model_checkpoint_path``, a real directory with a committed ``MANIFEST.json``) are
counted, kept or deleted. Any other entry — a user's directory or file, a FIFO, a symbolic link —
is left alone (and stays listed); an entry that no longer exists is dropped from the index.
``--keep N`` therefore keeps N real checkpoints, never a missing one.

The N kept are the newest that a restore can use: each verifies in full and loads under the
allowlist (``torch.load(weights_only=True)`` of its structure, no tensor data; a checkpoint
that needs a user's class counts, since its writer's ``trusted_globals`` load it). A
checkpoint that fails either — damaged, or forged to run code (`supervisor.checkpoint.
dangerous_globals`: it may be malicious) — is not counted, so it can never make prune delete
the loadable ones; it is deleted unless it is the index's or the restart's choice. When no
checkpoint the index lists loads, prune deletes nothing.
"""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field

from supervisor.checkpoint import (
    CheckpointReader,
    CheckpointState,
    choose_checkpoint,
    deletable_problem,
    read_index,
    relative_index,
    remove_checkpoint,
    step_of,
    write_index,
)
from supervisor.checkpoint.layout.index import keep_entries
from supervisor.checkpoint.formats.safe_globals import UntrustedCheckpointError
from supervisor.checkpoint.storage import Location, Storage
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, Refused, error, writer_lock
from supervisor.cli._remote import add_storage_options, is_url, mutate_url, relative_url_index
from supervisor.errors import CheckpointError

__all__ = ["add_parser", "run", "Plan", "plan", "drop_from_index"]

_MISSING = "it does not exist"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prune", help="delete all but the N newest indexed checkpoints",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("logdir", metavar="LOGDIR")
    p.add_argument("--keep", metavar="N", type=_positive, required=True, help="how many checkpoints to keep (>= 1)")
    p.add_argument("--dry-run", action="store_true", help="print what would be deleted; delete nothing")
    add_storage_options(p)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--keep must be a positive integer such as 3, got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    if is_url(args.logdir):
        return _run_url(args)
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


def _run_url(args: argparse.Namespace) -> int:
    """``prune s3://...``: the same rule, under the logdir's lease (a live one refuses it)."""
    return mutate_url(args, "prune", lambda storage, url: _prune(args, url, storage), locked=not args.dry_run)


@dataclass(frozen=True)
class Plan:
    """What a prune does: names kept and deleted (committed checkpoints), entries left alone with
    why (not checkpoints), and entries dropped from the index because they no longer exist."""

    kept: list[str]
    deleted: list[str]
    left_alone: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unusable: list[tuple[str, str]] = field(default_factory=list)
    loadable: int = -1  # how many of the kept load (-1: not checked)


def plan(logdir: str, index: CheckpointState, keep: int, basename: str, protected: tuple[str, ...] = (),
         storage: Storage | None = None) -> Plan:
    """Keeps the ``keep`` highest-step committed checkpoints the (relative) index lists that
    verify and load (`usable`), its ``model_checkpoint_path``, ``protected`` and those that could
    not be read; deletes the other committed ones. ``storage``: a URL logdir's, built once by the
    command (every checkpoint is read through it)."""
    committed, left_alone, missing = [], [], []
    for name in dict.fromkeys(index.all_model_checkpoint_paths):
        problem = deletable_problem(logdir, name, basename, storage)
        if problem is None:
            committed.append(name)
        elif problem == _MISSING:
            missing.append(name)
        else:
            left_alone.append((name, problem))
    by_step = sorted(committed, key=lambda n: (step_of(n, basename), committed.index(n)))
    usable, unusable, unread = [], [], []
    for name in reversed(by_step):  # newest first, until `keep` of them load
        if len(usable) == keep:
            break
        ok, why = _usable(logdir, name, storage)
        (usable if ok else unusable if ok is False else unread).append(name if ok else (name, why))
    kept = {*usable, *(n for n, _ in unread), os.path.normpath(index.model_checkpoint_path), *protected}
    if not usable:
        kept |= set(committed)  # nothing loads: deleting would leave nothing usable, so delete nothing
    return Plan([n for n in committed if n in kept], [n for n in committed if n not in kept], left_alone, missing,
                unusable + unread, len(usable))


def _usable(logdir: str, name: str, storage: Storage | None) -> tuple[bool | None, str]:
    """Whether the checkpoint ``name`` verifies in full and its structure loads under the
    allowlist: (True, ""), (False, why not), or (None, why) when it could not be read."""
    path = os.path.join(logdir, name) if storage is None else Location(storage.join(logdir, name), storage)
    try:
        CheckpointReader(path, verify="full").close()
    except UntrustedCheckpointError as e:
        if e.malicious:  # the refusal says why (and never suggests trusting it)
            return False, f"it does not load and may be malicious: {e}"
        return True, ""  # a user's classes: loads with the trusted_globals its writer passes
    except CheckpointError as e:
        return False, f"it does not verify or load: {e}"
    except OSError as e:
        return None, f"it could not be read, so it is kept: {e}"
    return True, ""


def drop_from_index(logdir: str, index: CheckpointState, names: list[str], *, basename: str | None = None,
                    forget: list[str] = (), storage: Storage | None = None) -> int:
    """Rewrites the index without ``names`` and ``forget`` (atomically), then deletes ``names``;
    returns how many could not be deleted. A name that is not a committed checkpoint
    (`deletable_problem`) is neither deleted nor dropped from the index."""
    refused = {n: p for n in names if (p := deletable_problem(logdir, n, basename, storage)) not in (None, _MISSING)}
    for name, problem in refused.items():
        print(f"left alone {name}: {problem}")
    names = [n for n in names if n not in refused]
    dropped = set(names) | set(forget)
    keep = [(p, i) for i, p in enumerate(index.all_model_checkpoint_paths) if p not in dropped]
    write_index(logdir, keep_entries(index, keep), storage)  # times and metrics stay with their checkpoints
    failures = 0
    for name in names:
        try:
            path = os.path.join(logdir, name) if storage is None else storage.join(logdir, name)
            removed = remove_checkpoint(path, basename, storage)
        except OSError as e:
            error(f"could not delete {name}: {e}")
            failures += 1
            continue
        print(f"deleted {name}" if removed else f"{name} was already gone")
    return failures


def _basename_of(index: CheckpointState) -> str | None:
    """The run's checkpoint basename, from ``model_checkpoint_path`` (``<basename>-<step>``)."""
    match = re.fullmatch(r"(?P<base>[^/\\]+)-\d+", os.path.basename(os.path.normpath(index.model_checkpoint_path)))
    return match.group("base") if match else None


def _restore_choice(logdir: str, basename: str, storage: Storage | None = None) -> tuple[str, ...]:
    """The name of the checkpoint a restart would restore (verified in full), if any."""
    try:
        choice = choose_checkpoint(logdir, basename, verify="full", storage=storage)
    except CheckpointError as e:
        print(f"no checkpoint of {logdir} verifies ({e}); nothing restorable to protect")
        return ()
    return (os.path.basename(choice[0]),) if choice else ()


def _prune(args: argparse.Namespace, logdir: str | None = None, storage: Storage | None = None) -> int:
    logdir = args.logdir if logdir is None else logdir
    try:
        index = read_index(logdir, storage)
    except (ValueError, OSError) as e:
        error(f"{e}; prune only deletes checkpoints a readable index lists, so it deletes nothing")
        return EXIT_PROBLEM
    if index is None:
        error(f"{args.logdir} has no checkpoint index; prune only deletes checkpoints the index lists")
        return EXIT_PROBLEM
    basename = _basename_of(index)
    if basename is None:
        error(f"the index of {args.logdir} names model_checkpoint_path {index.model_checkpoint_path!r}, not a "
              "checkpoint of the form <basename>-<step>, so prune cannot tell this run's checkpoints; it "
              "deletes nothing (fix the index, e.g. with `rollback`)")
        return EXIT_PROBLEM
    index = relative_index(index, os.path.abspath(logdir)) if storage is None else relative_url_index(logdir, index)
    todo = plan(logdir, index, args.keep, basename, _restore_choice(logdir, basename, storage), storage)
    print(f"keeping {len(todo.kept)}: {', '.join(todo.kept) or 'none'}")
    for name, problem in todo.unusable:
        print(f"not counted among the {args.keep} to keep: {name} ({problem.removeprefix('it ')})")
    if todo.loadable == 0 and todo.unusable:
        print("no checkpoint the index lists verifies and loads, so prune deletes nothing")
    for name, problem in todo.left_alone:
        print(f"left alone {name} (listed in the index, but {problem.removeprefix('it ')})")
    if todo.missing:
        print(f"no longer exist{'s' if len(todo.missing) == 1 else ''}: {', '.join(todo.missing)}"
              f"{' (would be dropped from the index)' if args.dry_run else ' (dropped from the index)'}")
    if not todo.deleted:
        print("nothing to delete")
        if todo.missing and not args.dry_run:
            drop_from_index(logdir, index, [], basename=basename, forget=todo.missing, storage=storage)
        return EXIT_OK
    if args.dry_run:
        print(f"would delete {len(todo.deleted)}: {', '.join(todo.deleted)} (dry run: nothing deleted)")
        return EXIT_OK
    failed = drop_from_index(logdir, index, todo.deleted, basename=basename, forget=todo.missing, storage=storage)
    return EXIT_PROBLEM if failed else EXIT_OK
