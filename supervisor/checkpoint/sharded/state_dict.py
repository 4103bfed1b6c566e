"""The DCP state of a `TrainingState`, saved and loaded (``checkpoint_format="dcp"``, SPEC §12).

`build_state_dict` / `apply_state_dict` (sharded tensors stay sharded), `save_sharded` (the
synchronous collective save), `restore_sharded` (every rank loads the path the chief chose) and
`load_into` (one process). The design is described in `supervisor.checkpoint.sharded`, the public
module of the DCP pair, which re-exports these and the manager (`supervisor.checkpoint.sharded.manager`,
which builds on this module).
"""
from __future__ import annotations

import io
import logging
import os
from typing import Any, Iterable, Mapping

import torch

from supervisor import distributed
from supervisor.state import resume
from supervisor.checkpoint.sharded import commit as dcp_commit
from supervisor.checkpoint.formats.dcp_reading import read_metadata, safe_dcp_load
from supervisor.checkpoint.sharded.restore import checked_bytes, checked_file
from supervisor.checkpoint.layout.fencing import data_path
from supervisor.checkpoint.layout.format import Manifest, checkpoint_name
from supervisor.checkpoint.load.apply import Restored
from supervisor.checkpoint.load.loader import verify_checkpoint as check_checkpoint
from supervisor.checkpoint.load.choose import choose_checkpoint
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.storage import Storage, storage_for
from supervisor.checkpoint.layout.verify import DCP_METADATA
from supervisor.distributed.rng import restore_for_rank
from supervisor.errors import CheckpointError
from supervisor.state.resume import loader_generators
from supervisor.state.rng import capture_rng_state
from supervisor.state import TrainingState, unwrap_module

__all__ = ["DCP_METADATA", "apply_state_dict", "build_state_dict", "choose_checkpoint", "load_into", "restore_sharded",
           "save_sharded"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- state dicts
def _split(state: TrainingState) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    modules = {n: unwrap_module(o) for n, o in state.items() if isinstance(unwrap_module(o), torch.nn.Module)}
    optimizers = {n: o for n, o in state.items() if isinstance(o, torch.optim.Optimizer)}
    others = {n: o for n, o in state.items() if n not in modules and n not in optimizers}
    return modules, optimizers, others


def _owner(modules: Mapping[str, Any], optimizer_name: str) -> Any:
    if len(modules) != 1:
        raise CheckpointError(f"checkpoint_format='dcp' pairs each optimizer with the model it optimises; "
                              f"the state has {len(modules)} modules ({sorted(modules)}) for optimizer "
                              f"{optimizer_name!r}. Use one module entry, or checkpoint_format='torch'")
    return next(iter(modules.values()))


def build_state_dict(state: TrainingState) -> dict[str, Any]:
    """The DCP state dict of a training state: ``get_model_state_dict`` / ``get_optimizer_state_dict``
    (sharded tensors stay sharded; fully-qualified names, no wrapper prefixes), plain
    ``state_dict()`` for every other object."""
    # lazy: torch.distributed.checkpoint is a heavy import, paid only by sharded checkpoints
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    modules, optimizers, others = _split(state)
    out: dict[str, Any] = {n: get_model_state_dict(m) for n, m in modules.items()}
    for name, optimizer in optimizers.items():
        out[name] = get_optimizer_state_dict(_owner(modules, name), optimizer)
    for name, obj in others.items():
        out[name] = obj.state_dict()
    return out


def apply_state_dict(state: TrainingState, loaded: Mapping[str, Any]) -> None:
    """Loads what `build_state_dict` built (and ``dcp.load`` filled) back into the objects."""
    # lazy: torch.distributed.checkpoint is a heavy import, paid only by sharded checkpoints
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    modules, optimizers, others = _split(state)
    for name, module in modules.items():
        set_model_state_dict(module, loaded[name])
    for name, optimizer in optimizers.items():
        set_optimizer_state_dict(_owner(modules, name), optimizer, loaded[name])
    for name, obj in others.items():
        obj.load_state_dict(loaded[name])


# ---------------------------------------------------------------- saving
def save_sharded(directory: str, basename: str, step: int, state: TrainingState, *, wall_time: float,
                 publish: Any = None, save_rng: bool = True, timeout_secs: float = 1800.0,
                 storage: Storage | None = None) -> str:
    """Every rank's shards of ``state`` as the committed checkpoint ``<basename>-<step>``,
    synchronously, on the calling (training) thread.

    A collective over the default group (every rank calls it at the same step); the commit
    protocol is `supervisor.checkpoint.sharded.commit.commit`. ``publish(name, wall_time)`` runs on
    the chief after the commit (index and retention; e.g. a `CheckpointManager`'s). ``storage``:
    the logdir's (an object store needs its client options on every rank; default: the one the
    path names). Returns the committed path.

    Raises:
        CheckpointError: on every rank, when any rank failed (the temp directory is removed).
    """
    rank, size = dcp_commit.rank_and_size()
    key = dcp_commit.next_save_key()  # first: every rank numbers this save, even if its capture fails
    save = dcp_commit.ShardedSave(
        directory, checkpoint_name(basename, step), int(step), wall_time, build_state_dict(state),
        capture_rng_state(loader_generators(state)) if save_rng else None, key,
        rank=rank, world_size=size, timeout_secs=timeout_secs, publish=publish if rank == 0 else None,
        storage=storage)
    return dcp_commit.commit(save, dcp_commit.channel_for())


# ---------------------------------------------------------------- restoring
def restore_sharded(path: str, state: TrainingState, *, step: int, restore_rng: bool = True,
                    unpickling: Unpickling = Unpickling(), storage: Storage | None = None,
                    manifest: Manifest | None = None, metadata: bytes | None = None, verify: str = "full",
                    items: Mapping[tuple[str, int], bytes] | None = None, no_dist: bool | None = None) -> Restored:
    """Loads the DCP checkpoint at ``path`` into ``state`` on this rank (every rank calls it with
    the path the chief chose); DCP reshards to this job's world size. With ``restore_rng``, this
    rank's RNG and data-loader generator states come back as from a ``state.pt`` checkpoint
    (`supervisor.state.resume`); a rank the checkpoint has no state for gets a derived seed (§12).

    Nothing in the checkpoint can run code (`supervisor.checkpoint.formats.dcp_reading.safe_dcp_load`):
    a global outside DCP's metadata classes, or outside ``unpickling``'s allow-list (the
    restorer's `Unpickling` record) in a non-tensor entry, is refused with a `CheckpointError` naming it.

    ``storage``: the logdir's (default: the one ``path`` names). On an object store each rank
    reads only the byte ranges of the shards it needs (ranged reads of the versions listed once).

    ``manifest``: the checkpoint's (the chief's choice carries it): ``.metadata`` (``metadata``:
    its bytes, as the chief sent them; else read here) and this rank's RNG file are checked
    against it (``verify``), and each item read against its CRC-32 when the checkpoint has them
    (`supervisor.checkpoint.formats.dcp_ranges`); `CheckpointCorruptError` names what differs. ``items``:
    bytes of items the chief sent, checked (`supervisor.checkpoint.formats.dcp_replicated`): not read here.
    ``no_dist=True``: this rank loads alone (its own part in the local tier, SPEC §17)."""
    storage = storage if storage is not None else storage_for(path)
    live = resume.live_iterators(state)  # exact resume: checked before the load
    if manifest is not None:
        data = metadata if metadata is not None else checked_file(path, DCP_METADATA, manifest, storage, verify=verify)
        metadata = read_metadata(checked_bytes(path, DCP_METADATA, data, manifest, verify=verify), path)
    try:
        _load(path, state, no_dist=not distributed.is_initialized() if no_dist is None else no_dist,
              unpickling=unpickling, storage=storage, metadata=metadata, items=items)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"restoring the sharded checkpoint {path} (step {step}) failed: "
                              f"{type(e).__name__}: {e}") from e
    where = f"{path} (step {step})"
    resume.prime_loaders(state, live, where)  # may draw from the RNG, so before it is restored
    if restore_rng:
        _restore_rng(path, step, state, distributed.rank(), storage, manifest=manifest, verify=verify)
    return Restored(global_step=step, path=path)


def _load(path: str, state: TrainingState, *, no_dist: bool, unpickling: Unpickling,
          storage: Storage, metadata: Any = None, items: Mapping[tuple[str, int], bytes] | None = None) -> None:
    state_dict = build_state_dict(state)
    safe_dcp_load(state_dict, path, no_dist=no_dist, unpickling=unpickling, storage=storage, metadata=metadata,
                  items=items)
    apply_state_dict(state, state_dict)


def _restore_rng(path: str, step: int, state: TrainingState, rank: int, storage: Storage, *,
                 manifest: Manifest | None = None, verify: str = "full") -> None:
    """``rank``'s ``rng-<rank>.pt`` (global generators and the state's loader generators), or
    a derived seed when the checkpoint has none for ``rank`` (the world size changed)."""
    where = f"{path} (step {step})"
    path = data_path(path, storage)  # on an object store, the root the manifest names (fencing.py)
    files = {int(f[4:-3]): f for f in storage.listdir(path)
             if f.startswith("rng-") and f.endswith(".pt") and f[4:-3].isdigit()}
    if not files:
        logger.warning("%s has no RNG state; the random generators continue from their current state", path)
    elif rank in files:
        name = storage.join(path, files[rank])
        if manifest is not None:  # checked against the chief's manifest, read once
            source: Any = io.BytesIO(checked_file(path, files[rank], manifest, storage, verify=verify))
        else:
            source = io.BytesIO(storage.read_bytes(name)) if storage.is_object_store else name  # an object: in memory
        resume.restore_rng(Unpickling().load(source, step=step, shown_as=name), state, where=where)
    else:
        restore_for_rank(dict.fromkeys(files), rank, step=step, where=where)  # only the keys matter


def load_into(path: str | os.PathLike, target: Any, *, verify: str = "full", restore_rng: bool = True,
              trusted_globals: Iterable[Any] = (), storage_options: Mapping[str, Any] | None = None) -> int:
    """Loads a DCP checkpoint into a plain, non-distributed module (its ``"model"`` entry) or
    `TrainingState` in this one process — for evaluation, export, or resuming a one-process run
    from a sharded checkpoint. Verifies it first.

    Into a `TrainingState` with ``restore_rng``, the process takes **rank 0's** RNG state and
    data-loader generators (``rng-0.pt``), as a one-process restore of a ``state.pt`` checkpoint
    does, and its ``StatefulDataLoader`` s are primed (`supervisor.state.resume`): the run continues
    as rank 0 would have. The other ranks' RNG files are not read. Non-tensor entries (a
    loader's position, say) hold the one copy DCP kept (it writes each such entry once, from one
    rank). Into a plain module no RNG is touched. Unpickling is restricted as in
    `restore_sharded` (``trusted_globals``: the classes a non-tensor entry may hold).
    ``path`` may be an object-store URL (``storage_options``: its client's options); the
    checkpoint is then read twice (verified, then loaded by ranged reads) — an evaluator reads
    it once with `supervisor.load_checkpoint`.

    Returns:
        The checkpoint's step.
    """
    path = os.fspath(path)
    storage, unpickling = storage_for(path, storage_options), Unpickling(trusted_globals)  # resolved once
    manifest = check_checkpoint(path, verify=verify, storage=storage)
    if DCP_METADATA not in manifest.files:
        raise CheckpointError(f"{path} is not a sharded (checkpoint_format='dcp') checkpoint; use "
                              "supervisor.load_checkpoint or restore_partial")
    if isinstance(target, TrainingState):
        live = resume.live_iterators(target)
        _load(path, target, no_dist=True, unpickling=unpickling, storage=storage)
        resume.prime_loaders(target, live, f"{path} (step {manifest.step})")
        if restore_rng:
            _restore_rng(path, manifest.step, target, 0, storage)
    else:
        module = unwrap_module(target)
        state_dict = {"model": module.state_dict()}
        safe_dcp_load(state_dict, path, no_dist=True, unpickling=unpickling, storage=storage)
        module.load_state_dict(state_dict["model"])
    return manifest.step
