"""``inspect CHECKPOINT``: variable names, shapes, dtypes and bytes, without loading tensors.

``CHECKPOINT`` is a checkpoint directory, a log directory (the checkpoint its index names) or a
``torch.save`` file. The file is memory-mapped (``torch.load(mmap=True, weights_only=True)``):
only the pickled structure is read, no tensor data, so inspecting a many-GiB checkpoint takes
a few MiB of memory. Names are those of `supervisor.list_variables` (``model/encoder.0.weight``).
The manifest's file sizes are checked, not the checksums (``verify`` does that).
"""
from __future__ import annotations

import argparse
import fnmatch
import os

from supervisor.checkpoint.index import get_checkpoint_state
from supervisor.checkpoint.reader import CheckpointReader, resolve_checkpoint
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, error, format_bytes, print_json, table
from supervisor.errors import CheckpointError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("inspect", help="names, shapes, dtypes and bytes, without loading tensors",
                              description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory, a log directory or a .pt file")
    p.add_argument("--json", action="store_true", help="one JSON object for the checkpoint, for scripts")
    p.add_argument("--filter", metavar="GLOB", default=None, help="only variables matching GLOB, e.g. 'model/*'")


def run(args: argparse.Namespace) -> int:
    try:
        path = os.path.abspath(resolve_checkpoint(args.checkpoint))
        with CheckpointReader(path) as reader:
            step, variables = reader.step, reader.variables()
    except CheckpointError as e:
        if args.json:
            print_json({"step": None, "path": os.path.abspath(args.checkpoint), "verified": False,
                        "reason": str(e), "indexed": False, "variables": [], "bytes": 0})
        error(str(e))
        return EXIT_PROBLEM
    if args.filter:
        variables = [v for v in variables if fnmatch.fnmatchcase(v.name, args.filter)]
    total = sum(v.nbytes for v in variables)
    if args.json:
        print_json({"step": step, "path": path, "verified": True, "reason": None, "indexed": _indexed(path),
                    "verification": "size" if os.path.isdir(path) else None, "bytes": total,
                    "variables": [{"name": v.name, "shape": list(v.shape), "dtype": _dtype(v.dtype),
                                   "bytes": v.nbytes} for v in variables]})
        return EXIT_OK
    where = f"step {step}, " if step is not None else ""
    print(f"{path} ({where}{len(variables)} variables, {format_bytes(total)})")
    body = [[v.name, "(" + ", ".join(map(str, v.shape)) + ("," if len(v.shape) == 1 else "") + ")",
             _dtype(v.dtype), format_bytes(v.nbytes)] for v in variables]
    print(table(["NAME", "SHAPE", "DTYPE", "SIZE"], body, right=(3,)))
    return EXIT_OK


def _dtype(dtype: object) -> str:
    return str(dtype).removeprefix("torch.")


def _indexed(path: str) -> bool:
    state = get_checkpoint_state(os.path.dirname(path)) if os.path.isdir(path) else None
    return state is not None and os.path.abspath(state.model_checkpoint_path) == path
