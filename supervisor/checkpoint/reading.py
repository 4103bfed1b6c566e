"""Read a committed checkpoint once, verifying it in the same read (SPEC §5.5, §10.4): what an
evaluator uses while a trainer writes and deletes underneath it — the old import path of
`supervisor.checkpoint.loader.read_checkpoint` (the one verified loader; see its docstring),
re-exported here with `CheckpointRead` and `CheckpointVanishedError`.
"""
from __future__ import annotations

from supervisor.checkpoint.loader import CheckpointRead, read_checkpoint
from supervisor.errors import CheckpointVanishedError

__all__ = ["CheckpointRead", "CheckpointVanishedError", "read_checkpoint"]
