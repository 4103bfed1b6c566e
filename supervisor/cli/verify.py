"""``verify PATH``: check a checkpoint against its manifest (sizes and checksums).

``PATH`` is one checkpoint directory, or a log directory (every checkpoint in it is checked).
Exit code 1 when one fails or ``PATH`` holds no checkpoint; 2 when ``PATH`` is another kind of
thing (the index file, a file of a checkpoint, a parent of log directories: the message says
what to pass). ``--json`` prints one JSON array with one object per checkpoint (``step``,
``path``, ``verified``, ``reason``, ``indexed``, ``in_index``, ...), the same objects ``ls``
prints. ``--local-dir DIR``: every checkpoint of the node-local tier is checked too.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from supervisor.checkpoint import read_index
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CheckpointRow, annotate_retention, check_one, \
    error, format_bytes, index_membership, print_json, scan_logdir, summary, table
from supervisor.cli._paths import advice, path_kind
from supervisor.cli._tiers import add_local_dir, local_listing
from supervisor.cli._remote import (UrlProblem, add_storage_options, check_url, connect, is_checkpoint, is_url,
                                    missing, names_in_index, scan)

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="verify a checkpoint (or every checkpoint of a logdir)",
                              description=summary(__doc__))
    p.add_argument("path", metavar="PATH", help="a checkpoint directory or a log directory")
    p.add_argument("--json", action="store_true", help="one JSON object per checkpoint, for scripts")
    p.add_argument("--quick", action="store_true", help="check file sizes only, not checksums")
    add_local_dir(p)
    add_storage_options(p)


def run(args: argparse.Namespace) -> int:
    mode = "size" if args.quick else "full"
    if is_url(args.path):
        try:
            rows, problem = _url_rows(args, mode)
        except UrlProblem as e:
            error(str(e))
            return e.code
        return _report(args, rows, problem, mode)
    path = os.path.abspath(args.path)
    found = path_kind(path)
    wrong = advice(found, "verify", accepts=("checkpoint", "logdir"))
    if wrong:
        error(wrong)
        return EXIT_USAGE
    if found.kind in ("checkpoint", "missing"):
        indexed, in_index, index_time, basename = index_membership(path)
        rows = [check_one(path, basename=basename, verify=mode, indexed=indexed, in_index=in_index,
                          index_time=index_time)]
        problem = None
        annotate_retention(_index_or_none(os.path.dirname(path)), rows)
    else:
        listing = scan_logdir(path, verify=mode)
        rows, problem = listing.rows, listing.index_problem
        annotate_retention(listing.index, rows)
        if not rows:
            problem = problem or f"{args.path} holds no checkpoint"
    return _report(args, rows, problem, mode)


def _url_rows(args: argparse.Namespace, mode: str) -> tuple[list[CheckpointRow], str | None]:
    """The rows of ``verify s3://...``: one checkpoint (each object read once, checked while
    read) or every checkpoint of a log directory."""
    url = args.path.rstrip("/")
    storage = connect(url, args)
    if is_checkpoint(storage, url):
        logdir, name = storage.dirname(url), storage.basename(url)
        index = _index_or_none(logdir, storage)
        named, listed = names_in_index(logdir, index) if index is not None else (None, [])
        rows = [check_url(storage, logdir, name, verify=mode, indexed=name == named, in_index=name in listed)]
        annotate_retention(index, rows)
        return rows, None
    gone = missing(storage, url)
    if gone:
        return [CheckpointRow(None, url, storage.basename(url), False, "does not exist", False, False, None, 0)], gone
    listing = scan(storage, url, verify=mode)
    annotate_retention(listing.index, listing.rows)
    return listing.rows, listing.index_problem or (None if listing.rows else f"{args.path} holds no checkpoint")


def _index_or_none(logdir: str, storage: Any = None) -> Any:
    """The logdir's index as written, None when it is missing or unreadable (as ``ls`` shows it)."""
    try:
        return read_index(logdir, storage)
    except (ValueError, OSError):
        return None


def _report(args: argparse.Namespace, rows: list[CheckpointRow], problem: str | None, mode: str) -> int:
    local = local_listing(args, verify=mode)
    if local is not None:  # --local-dir: the local tier's checkpoints too
        rows = rows + local.rows
        problem = problem or local.index_problem
    if args.json:
        print_json([r.to_json() for r in rows])
    else:
        print(_render(rows, mode))
    if problem:
        error(problem)
    return EXIT_PROBLEM if problem or any(not r.verified for r in rows) else EXIT_OK


def _render(rows: list[CheckpointRow], mode: str) -> str:
    checked = "sizes and checksums" if mode == "full" else "sizes only"
    body = [["ok" if r.verified else "FAILED", "?" if r.step is None else str(r.step),
             format_bytes(r.bytes) if r.bytes else "-", r.path + ("" if r.verified else f": {r.reason}")]
            for r in rows]
    return table(["RESULT", "STEP", "SIZE", f"CHECKPOINT ({checked})"], body, right=(1, 2))
