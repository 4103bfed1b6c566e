"""Restore a checkpoint (SPEC §5.4): verify, load, choose, apply — the old import path.

The work lives in one module per step: `supervisor.checkpoint.loader` (the one verified
loader: read once through the logdir's `Storage`, checksummed while reading, into a private
copy; ``load_verified``, ``load_private_copy``), `supervisor.checkpoint.choose` (the newest good
checkpoint: ``find_and_load``, ``choose_checkpoint``), `supervisor.checkpoint.apply`
(``apply_checkpoint``, ``Restored``), `supervisor.checkpoint.verify` (a checkpoint against its
manifest) and `supervisor.checkpoint.safe_globals` (``safe_torch_load``: ``weights_only`` and
the allowlists). This module re-exports them for the code and users that import them from here.
"""
from __future__ import annotations

from supervisor.checkpoint.apply import Restored, apply_checkpoint
from supervisor.checkpoint.choose import choose_checkpoint, find_and_load
from supervisor.checkpoint.loader import LoadedCheckpoint, load_private_copy, load_verified
from supervisor.checkpoint.loader import verify_checkpoint as check_checkpoint
from supervisor.checkpoint.safe_globals import safe_torch_load
from supervisor.checkpoint.verify import DCP_METADATA, VERIFY_MODES, check_verify

__all__ = ["DCP_METADATA", "LoadedCheckpoint", "Restored", "VERIFY_MODES", "apply_checkpoint", "check_checkpoint",
           "check_verify", "choose_checkpoint", "find_and_load", "load_private_copy", "load_verified",
           "safe_torch_load"]
