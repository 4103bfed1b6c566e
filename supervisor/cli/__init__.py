"""The ``torch-supervisor`` / ``python -m supervisor`` command line (SPEC §13).

Subcommands, one module each in this package::

    ls LOGDIR                  checkpoints: step, age, size, verified or why not, which the index names
    verify PATH                verify a checkpoint (or every checkpoint of a logdir)
    inspect CHECKPOINT         variable names, shapes, dtypes and bytes, without loading tensors
    rollback LOGDIR STEP       point the index at an older checkpoint (atomically)
    prune LOGDIR --keep N      delete all but the N newest indexed checkpoints
    evaluate ...               the sidecar evaluator (supervisor/cli/evaluate.py)

Exit codes: 0 ok, 1 a problem was found (a checkpoint fails verification or is missing, or a
mutation was refused because a writer holds the lock), 2 usage error (also a path of the wrong
kind: the index file, a file of a checkpoint, a checkpoint directory where a log directory is
wanted, a parent of log directories — the message names what to pass). Output cut short by its
reader (``ls --json | head -2``) ends the command quietly with status 141 (128 + SIGPIPE, what a
shell reports for a Unix tool in the same place), without a traceback.

Object stores: every PATH/LOGDIR may be an ``s3://bucket/prefix`` URL, the client configured by
the environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``..., ``~/.aws``, ``FSSPEC_S3_*``) or
by ``--storage-options JSON`` (`supervisor.cli._remote`). A ``file://`` URL is its local path, and
a misspelt URL (``s3:/bucket/x``) a usage error naming the spelling to use, as in every front door.

Adding a subcommand: a module ``supervisor/cli/<name>.py`` defining ``add_parser(subparsers)
-> None`` (which adds the parser named ``<name>``) and ``run(args) -> int`` (the exit code), and
its name in `SUBCOMMANDS`. Only ``ls``/``verify``/``inspect`` read; ``rollback``/``prune`` take the
writer's lock while they change the logdir (never while a writer holds it).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from types import ModuleType
from typing import Sequence

from supervisor.cli._common import EXIT_BROKEN_PIPE, EXIT_USAGE, output_cut_short
from supervisor._paths import local_path
from supervisor.cli._remote import is_url, options_for_local

__all__ = ["main", "build_parser", "SUBCOMMANDS", "EXIT_BROKEN_PIPE"]

logger = logging.getLogger(__name__)

SUBCOMMANDS = ("ls", "verify", "inspect", "rollback", "prune", "evaluate")
_OPTIONAL = ("evaluate",)  # may be absent from a build; the others are part of this package


def _load(name: str) -> ModuleType | ImportError:
    try:
        return importlib.import_module(f"supervisor.cli.{name}")
    except ImportError as e:
        if name in _OPTIONAL:  # absent, or broken: the other subcommands still work
            return e
        raise


def build_parser(prog: str | None = None) -> tuple[argparse.ArgumentParser, dict[str, ModuleType | ImportError]]:
    """The top-level parser and the subcommand modules by name (an ImportError for a missing one)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Look at and repair a torch-supervisor log directory.",
        epilog="Paths may be s3://bucket/prefix URLs: the client is configured by the environment (AWS_ENDPOINT_URL, "
               "AWS_ACCESS_KEY_ID..., ~/.aws, FSSPEC_S3_*) or a subcommand's --storage-options JSON. "
               "Exit codes: 0 ok, 1 problem found (or refused: a writer holds the lock or lease), 2 usage error.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages to stderr")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    modules = {name: _load(name) for name in SUBCOMMANDS}
    for name, module in modules.items():
        if isinstance(module, ImportError):
            subparsers.add_parser(name, help=f"(not available in this installation: {module})")
        else:
            module.add_parser(subparsers)
    return parser, modules


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Runs one subcommand; returns its exit code (argparse exits with 2 on a usage error)."""
    parser, modules = build_parser(prog)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    module = modules[args.command]
    if isinstance(module, ImportError):
        print(f"error: the {args.command!r} subcommand is not available: {module}", file=sys.stderr)
        return EXIT_USAGE
    misplaced = _spelled_paths(args) or _misplaced_options(args)
    if misplaced:
        print(f"error: {misplaced}", file=sys.stderr)
        return EXIT_USAGE
    try:
        code = int(module.run(args))
        sys.stdout.flush()  # a pipe closed early fails here at the latest, not at interpreter exit
    except BrokenPipeError:
        return output_cut_short()
    return code



def _spelled_paths(args: argparse.Namespace) -> str | None:
    """Replaces a ``file://`` URL among the path arguments by its local path (as every front door
    takes it); the usage error for a misspelt URL (``s3:/bucket/x``: `check_url_spelling`)."""
    for attribute in [a for a in ("logdir", "path", "checkpoint", "log_dir") if hasattr(args, a)]:
        try:
            setattr(args, attribute, local_path(getattr(args, attribute)))
        except ValueError as e:
            return str(e)
    return None


def _misplaced_options(args: argparse.Namespace) -> str | None:
    """The usage error for ``--storage-options`` with a local path (None otherwise)."""
    for attribute in ("logdir", "path", "checkpoint"):
        target = getattr(args, attribute, None)
        if isinstance(target, str):
            return None if is_url(target) else options_for_local(target, args)
    return None
