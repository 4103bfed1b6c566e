"""``ls LOGDIR``: every checkpoint with its step, age, size and whether it verifies (why not).

The checkpoint the index points at (what a restart restores) is marked ``*``; one that fails
verification shows ``FAILED`` and the reason. ``--json`` prints one JSON array with one object
per checkpoint (`supervisor.cli._common.CheckpointRow`). Exit code 1 when any checkpoint fails
verification or the index is unreadable or names a missing checkpoint, or ``LOGDIR`` does not
exist; 2 when ``LOGDIR`` is a checkpoint directory, the index file, a file of a checkpoint or a
directory holding log directories but no checkpoint of its own (the message names what to pass).
A log directory without any checkpoint yet lists none, exit code 0.

Why each checkpoint is kept (``kept`` in ``--json``; a KEPT column when the writer kept the best
or every N-th step, with a METRIC column for the recorded metric): ``newest`` (among the newest
``max_to_keep``), ``best`` (among the ``keep_best`` best by ``best_metric``), ``period`` (its step
is a multiple of ``keep_period``), ``hours`` (preserved by ``keep_checkpoint_every_n_hours``).
``--local-dir DIR``: the node-local checkpoint tier too (`supervisor.cli._tiers`): both listed,
and what a restart restores.
"""
from __future__ import annotations

import argparse

from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, Listing, annotate_retention, error, \
    format_age, format_bytes, print_json, scan_logdir, summary, table, writer_note
from supervisor.cli._paths import advice, path_kind
from supervisor.cli._tiers import add_local_dir, local_listing, render_local, restore_line, tier_rows_json
from supervisor.cli._remote import UrlProblem, add_storage_options, is_url, lease_note, open_logdir, scan
from supervisor.checkpoint.layout.retention import RetentionRule, rule_of

__all__ = ["add_parser", "run", "render"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ls", help="list checkpoints: step, age, size, verified or why not",
                              description=summary(__doc__))
    p.add_argument("logdir", metavar="LOGDIR")
    p.add_argument("--json", action="store_true", help="one JSON object per checkpoint, for scripts")
    p.add_argument("--quick", action="store_true", help="check file sizes only, not checksums (fast on huge states)")
    p.add_argument("--basename", default=None, help="checkpoint name prefix (default: from the index, else model.ckpt)")
    add_local_dir(p)
    add_storage_options(p)


def run(args: argparse.Namespace) -> int:
    if is_url(args.logdir):
        return _run_url(args)
    found = path_kind(args.logdir)
    wrong = advice(found, "ls", accepts=("logdir",))
    if wrong:
        error(wrong)
        return EXIT_USAGE
    if found.kind == "missing":
        if args.json:
            print_json([])
        error(f"{args.logdir} is not a directory: it does not exist")
        return EXIT_PROBLEM
    listing = scan_logdir(args.logdir, basename=args.basename, verify="size" if args.quick else "full")
    return _show(listing, args)


def _run_url(args: argparse.Namespace) -> int:
    """``ls s3://bucket/prefix``: the same listing, read from the object store."""
    try:
        storage, url = open_logdir(args.logdir, args, "ls")
    except UrlProblem as e:
        if args.json and e.code == EXIT_PROBLEM:
            print_json([])
        error(str(e))
        return e.code
    listing = scan(storage, url, basename=args.basename, verify="size" if args.quick else "full")
    return _show(listing, args, lease_note(storage, url))


def _show(listing: Listing, args: argparse.Namespace, note: str | None = None) -> int:
    annotate_retention(listing.index, listing.rows)
    local = local_listing(args, basename=args.basename, verify="size" if args.quick else "full")
    if local is not None:
        return _show_tiers(listing, local, args, note)
    if args.json:
        print_json([row.to_json() for row in listing.rows])
        if listing.index_problem:
            error(listing.index_problem)
    else:
        print(render(listing, note))
    return EXIT_PROBLEM if listing.problems else EXIT_OK


def _show_tiers(listing: Listing, local: Listing, args: argparse.Namespace, note: str | None) -> int:
    """Both tiers (``--local-dir``): the logdir, the local tier, and what a restart restores."""
    if args.json:
        print_json(tier_rows_json(listing, local))
        for problem in (listing.index_problem, local.index_problem):
            if problem:
                error(problem)
    else:
        print("\n".join([render(listing, note), "", render_local(local, render), "", restore_line(listing, local)]))
    return EXIT_PROBLEM if listing.problems or local.problems else EXIT_OK


def render(listing: Listing, note: str | None = None) -> str:
    """The human listing: a summary line, aligned columns, a legend (``note``: who writes the
    logdir; looked up for a local path)."""
    rows = listing.rows
    failing = sum(not r.verified for r in rows)
    named = listing.index.model_checkpoint_path if listing.index is not None else None
    summary = f"{listing.logdir}: {len(rows)} checkpoint{'s' if len(rows) != 1 else ''}"
    summary += f", {failing} failing verification" if failing else ""
    summary += f"; the index points at {named}" if named else "; no index"
    lines = [summary]
    note = note if note is not None or is_url(listing.logdir) else writer_note(listing.logdir)
    if note:
        lines.append(f"{note} (checkpoints may appear or be deleted while you look)")
    if listing.index_problem:
        lines.append(f"index problem: {listing.index_problem}")
    if not rows:
        return "\n".join(lines + ["(no checkpoints)"])
    ranked = listing.index is not None and rule_of(listing.index) is not None
    body = []
    for r in rows:
        status = "ok" if r.verified else f"FAILED: {r.reason}"
        if not r.in_index and not r.indexed and r.verified and r.kept != ["hours"]:
            status += " (not in the index: retention never deletes it)"
        cells = ["*" if r.indexed else "", "?" if r.step is None else str(r.step), r.name,
                 format_age(r.wall_time), format_bytes(r.bytes) if r.bytes else "-"]
        extra = ["-" if r.metric is None else f"{r.metric:.6g}", ",".join(r.kept) or "-"] if ranked else []
        body.append(cells + extra + [status])
    header = ["", "STEP", "NAME", "SAVED", "SIZE"] + (["METRIC", "KEPT"] if ranked else []) + ["STATUS"]
    lines.append(table(header, body, right=(1, 4, 5) if ranked else (1, 4)))
    if named:
        lines.append("(* = the checkpoint the index points at: a restart restores it)")
    if ranked:
        lines.append(_kept_legend(rule_of(listing.index)))
    return "\n".join(lines)


def _kept_legend(rule: RetentionRule) -> str:
    parts = [f"newest = among the newest max_to_keep={rule.max_to_keep}"]
    if rule.keep_best:
        parts.append(f"best = among the keep_best={rule.keep_best} best by {rule.best_metric} ({rule.best_mode})")
    if rule.keep_period:
        parts.append(f"period = a step that is a multiple of keep_period={rule.keep_period} (kept forever)")
    return f"(KEPT: {'; '.join(parts)}; hours = keep_checkpoint_every_n_hours)"
