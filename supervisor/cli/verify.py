"""``verify PATH``: check a checkpoint against its manifest (sizes and checksums).

``PATH`` is one checkpoint directory, or a log directory (every checkpoint in it is checked).
Exit code 1 when one fails or ``PATH`` holds no checkpoint; ``--json`` prints one object per
checkpoint (``step``, ``path``, ``verified``, ``reason``, ``indexed``, ...).
"""
from __future__ import annotations

import argparse
import os

from supervisor.checkpoint.format import MANIFEST_FILE, STATE_FILE
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, CheckpointRow, check_one, error, format_bytes, \
    print_json, scan_logdir, table
from supervisor.checkpoint.index import get_checkpoint_state

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="verify a checkpoint (or every checkpoint of a logdir)",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("path", metavar="PATH", help="a checkpoint directory or a log directory")
    p.add_argument("--json", action="store_true", help="one JSON object per checkpoint, for scripts")
    p.add_argument("--quick", action="store_true", help="check file sizes only, not checksums")


def run(args: argparse.Namespace) -> int:
    mode = "size" if args.quick else "full"
    path = os.path.abspath(args.path)
    if _is_checkpoint_dir(path) or not os.path.isdir(path):
        rows = [check_one(path, verify=mode, indexed=_indexed(path))]
        problem = None
    else:
        listing = scan_logdir(path, verify=mode)
        rows, problem = listing.rows, listing.index_problem
        if not rows:
            problem = problem or f"{args.path} holds no checkpoint"
    if args.json:
        print_json([r.to_json() for r in rows])
    else:
        print(_render(rows, mode))
    if problem:
        error(problem)
    return EXIT_PROBLEM if problem or any(not r.verified for r in rows) else EXIT_OK


def _is_checkpoint_dir(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in (MANIFEST_FILE, STATE_FILE))


def _indexed(path: str) -> bool:
    state = get_checkpoint_state(os.path.dirname(path))
    return state is not None and os.path.abspath(state.model_checkpoint_path) == path


def _render(rows: list[CheckpointRow], mode: str) -> str:
    checked = "sizes and checksums" if mode == "full" else "sizes only"
    body = [["ok" if r.verified else "FAILED", "?" if r.step is None else str(r.step),
             format_bytes(r.bytes) if r.bytes else "-", r.path + ("" if r.verified else f": {r.reason}")]
            for r in rows]
    return table(["RESULT", "STEP", "SIZE", f"CHECKPOINT ({checked})"], body, right=(1, 2))
