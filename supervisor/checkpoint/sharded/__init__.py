"""Sharded checkpoints: ``torch.distributed.checkpoint`` inside the commit protocol (SPEC §12).

``checkpoint_format="dcp"`` for sharded state (DTensor parameters, FSDP2 ``fully_shard``): every
rank writes its own shards, in parallel, into **one** temp directory, and the chief seals it::

    model.ckpt-100/
      MANIFEST.json        # every file below with its size and CRC-32; written last
      .metadata            # DCP's global metadata (written by the chief's DCP coordinator)
      __0_0.distcp ...     # each rank's shards (FileSystemWriter, fsynced)
      rng-0.pt rng-1.pt    # each rank's RNG state (supervisor.state.rng), one file per rank

A save is a collective, called by every rank at the same step (the `CollectiveAgreement` makes
the step the same). The commit protocol (`supervisor.checkpoint.sharded.commit`): the chief creates
``model.ckpt-100.tmp-<hex>/`` and posts its path in the process group's store; every rank runs
``dcp.save`` into it, checksums the files it wrote (still in the page cache) and posts the
records; the chief, once it has every rank's records, checksums ``.metadata``, seals the
manifest naming every file, renames the directory, publishes the index (retention as for
``state.pt`` checkpoints) and posts its verdict, which every rank waits for. A failure on any
rank removes the temp directory and fails the save on every rank; a crash or SIGKILL at any
point leaves only the temp directory, never a published incomplete checkpoint.

On an object store (an ``s3://`` logdir, SPEC §16) the same protocol commits in place: the
checkpoint's prefix ``model.ckpt-100/`` is the staging area, every rank uploads its shards there
through the logdir's storage (`supervisor.checkpoint.formats.dcp_storage`: DCP's writer and reader over
the storage seam — multipart uploads checksummed while written, ``.metadata`` uploaded once
instead of DCP's write-then-rename, ranged reads at a restore), and the chief writes
``MANIFEST.json`` last with a create-only write, then the index with ``If-Match``; a prefix
without a manifest is no checkpoint, and the next writer opening the logdir removes it. Every
rank's manager needs the client options (``storage_options=``; the front doors pass theirs).

Saves are **asynchronous** by default (`ShardedCheckpointManager`, ``save_mode="async"``): the
training thread only copies the state into reused CPU buffers (DTensors as their local shards,
re-wrapped without a collective) and captures the RNG and loader-generator states; a background
thread runs the protocol above, with ``dcp.save``'s planning and metadata collectives on a gloo
group of the manager's own — never the default group, whose collectives (DDP's, the training
step's) belong to the training thread — and the records and verdict in the store. DCP's own
``async_save`` is not used: its background ``save`` runs collectives on the group it is given,
stages into fresh buffers each time, and has no place for the chief's seal after every rank's
files are known. `save_sharded` is the synchronous form (training thread, default group).

Restore: the chief chooses and verifies (§5.4: index first, full checksums, fall back to older),
posts the path, and every rank loads exactly that with DCP's loader — which reshards: the world
size may differ from the one that saved — then takes back its own ``rng-<rank>.pt`` (global
generators and data-loader ``generator=`` states, `supervisor.state.resume`; a rank with no file gets
a derived seed). `load_into` loads a DCP checkpoint into a plain module or a `TrainingState` in
one process (evaluation, export, resuming a one-process run), verified first; into a state it
restores rank 0's RNG and loader generators. Every load goes through
`supervisor.checkpoint.formats.dcp_reading.safe_dcp_load`: ``.metadata`` is unpickled with DCP's metadata
classes allowed and non-tensor entries with ``weights_only=True`` (DCP's own reader and planner
unpickle both unrestricted), so a checkpoint cannot run code on any rank.
"""
from __future__ import annotations

from typing import Any

from supervisor.checkpoint.sharded.state_dict import (
    DCP_METADATA,
    apply_state_dict,
    build_state_dict,
    choose_checkpoint,
    load_into,
    restore_sharded,
    save_sharded,
)
from supervisor.checkpoint.sharded.manager import ShardedCheckpointManager

__all__ = ["DCP_METADATA", "ShardedCheckpointManager", "ShardedSessionCreator", "apply_state_dict", "build_state_dict",
           "choose_checkpoint", "load_into", "restore_sharded", "save_sharded"]


def __getattr__(name: str) -> Any:
    """``ShardedSessionCreator``, which moved to `supervisor.creators.sharded` (issue 23), resolved
    at first use (PEP 562): this package never imports the creators at import time."""
    if name != "ShardedSessionCreator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from supervisor.creators import sharded  # the moved name; never at import time

    return sharded.ShardedSessionCreator
