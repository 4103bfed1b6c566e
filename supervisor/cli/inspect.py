"""``inspect CHECKPOINT``: variable names, shapes, dtypes and bytes, without loading tensors.

``CHECKPOINT`` is a checkpoint directory, a log directory (the checkpoint its index names) or a
``torch.save`` file. The file is memory-mapped (``torch.load(mmap=True, weights_only=True)``):
only the pickled structure is read, no tensor data, so inspecting a many-GiB checkpoint takes
a few MiB of memory. Names are those of `supervisor.list_variables` (``model/encoder.0.weight``).
The manifest's file sizes are checked, not the checksums (``verify`` does that).

Exit code 1 when there is no checkpoint at ``CHECKPOINT`` or it cannot be read (a file that
torch.save did not write: "is not a checkpoint"); 2 when ``CHECKPOINT`` is the index file or a
directory holding log directories but no checkpoint (the message names what to pass).
``inspect LOGDIR --local-dir DIR``: the checkpoint a restart on this node restores, from either
checkpoint tier (`supervisor.cli._tiers`).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import stat

from supervisor.checkpoint import CheckpointReader, get_checkpoint_state, read_index, resolve_checkpoint
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, error, format_bytes, print_json, summary, table
from supervisor.cli._common import scan_logdir
from supervisor.cli._paths import advice, path_kind
from supervisor.cli._tiers import add_local_dir, local_listing, restore_choice
from supervisor.cli._remote import UrlProblem, add_storage_options, connect, is_url, names_in_index
from supervisor.errors import CheckpointError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("inspect", help="names, shapes, dtypes and bytes, without loading tensors",
                              description=summary(__doc__))
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory, a log directory or a .pt file")
    p.add_argument("--json", action="store_true", help="one JSON object for the checkpoint, for scripts")
    p.add_argument("--filter", metavar="GLOB", default=None, help="only variables matching GLOB, e.g. 'model/*'")
    add_local_dir(p)
    add_storage_options(p)


# The first bytes of what torch.save writes: a zip archive (the default since torch 1.6), or
# the legacy format's pickle (protocol 2 and up start with the PROTO opcode 0x80).
_TORCH_SAVE_MAGIC = (b"PK\x03\x04", b"\x80")


def run(args: argparse.Namespace) -> int:
    if is_url(args.checkpoint):
        return _run_url(args)
    found = path_kind(args.checkpoint)
    wrong = advice(found, "inspect", accepts=("logdir", "checkpoint", "file", "checkpoint file"))
    if wrong is None and found.kind == "checkpoint file" and _not_torch_save(found.path):
        wrong = advice(found, "inspect", accepts=())  # e.g. a checkpoint's MANIFEST.json: inspect the checkpoint
    if wrong:
        error(wrong)
        return EXIT_USAGE
    if found.kind == "logdir" and args.local_dir is not None:  # the checkpoint a restart on this node restores
        choice = restore_choice(scan_logdir(args.checkpoint, verify="size"), local_listing(args, verify="size"))
        args.checkpoint = choice[1].path if choice is not None else args.checkpoint
    try:
        path = os.path.abspath(resolve_checkpoint(args.checkpoint))
        if found.kind == "file" and (problem := _not_torch_save(path)):
            raise CheckpointError(problem)
        with CheckpointReader(path) as reader:
            step, variables = reader.step, reader.variables()
    except CheckpointError as e:
        if args.json:
            print_json({"step": None, "path": os.path.abspath(args.checkpoint), "verified": False,
                        "reason": str(e), "indexed": False, "variables": [], "bytes": 0})
        error(str(e))
        return EXIT_PROBLEM
    return _show(args, path, step, variables, _indexed(path), "size" if os.path.isdir(path) else None)


def _run_url(args: argparse.Namespace) -> int:
    """``inspect s3://...``: the manifest and the pickled structure by range reads, no tensor data."""
    url = args.checkpoint.rstrip("/")
    try:
        storage = connect(url, args)
        with CheckpointReader(url, storage_options=args.storage_options) as reader:
            path, step, variables = reader.path, reader.step, reader.variables()
    except UrlProblem as e:
        error(str(e))
        return e.code
    except (CheckpointError, OSError) as e:
        if args.json:
            print_json({"step": None, "path": url, "verified": False, "reason": str(e), "indexed": False,
                        "variables": [], "bytes": 0})
        error(f"{url}: {e}" if url not in str(e) else str(e))
        return EXIT_PROBLEM
    try:
        named, _ = names_in_index(storage.dirname(path), read_index(storage.dirname(path), storage))
    except (ValueError, OSError):
        named = None
    return _show(args, path, step, variables, named == storage.basename(path), "size")


def _show(args: argparse.Namespace, path: str, step: int | None, variables: list, indexed: bool,
          verification: str | None) -> int:
    if args.filter:
        variables = [v for v in variables if fnmatch.fnmatchcase(v.name, args.filter)]
    total = sum(v.nbytes for v in variables)
    if args.json:
        print_json({"step": step, "path": path, "verified": True, "reason": None, "indexed": indexed,
                    "verification": verification, "bytes": total,
                    "variables": [{"name": v.name, "shape": list(v.shape), "dtype": _dtype(v.dtype),
                                   "bytes": v.nbytes} for v in variables]})
        return EXIT_OK
    where = f"step {step}, " if step is not None else ""
    print(f"{path} ({where}{len(variables)} variables, {format_bytes(total)})")
    body = [[v.name, "(" + ", ".join(map(str, v.shape)) + ("," if len(v.shape) == 1 else "") + ")",
             _dtype(v.dtype), format_bytes(v.nbytes)] for v in variables]
    print(table(["NAME", "SHAPE", "DTYPE", "SIZE"], body, right=(3,)))
    return EXIT_OK


def _not_torch_save(path: str) -> str | None:
    """Why ``path`` is not a file torch.save wrote (None when its first bytes say it is one). It
    is opened non-blocking and read only if it is a regular file (a FIFO would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        return f"{path} cannot be opened: {e.strerror}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{path} is not a checkpoint: not a regular file"
        head = os.read(fd, 4)
    finally:
        os.close(fd)
    if head.startswith(_TORCH_SAVE_MAGIC):
        return None
    return (f"{path} is not a checkpoint: not a file torch.save wrote (inspect takes a checkpoint directory, "
            "a log directory or a torch.save file)")


def _dtype(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _indexed(path: str) -> bool:
    state = get_checkpoint_state(os.path.dirname(path)) if os.path.isdir(path) else None
    return state is not None and os.path.abspath(state.model_checkpoint_path) == path
