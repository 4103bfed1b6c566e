"""Sharded checkpoints: ``torch.distributed.checkpoint`` inside the commit protocol (SPEC §12).

``checkpoint_format="dcp"`` for sharded state (DTensor parameters, FSDP2 ``fully_shard``): every
rank writes its own shards, in parallel, into **one** temp directory, and the chief seals it::

    model.ckpt-100/
      MANIFEST.json        # every file below with its size and CRC-32; written last
      .metadata            # DCP's global metadata (written by the chief's DCP coordinator)
      __0_0.distcp ...     # each rank's shards (FileSystemWriter, fsynced)
      rng-0.pt rng-1.pt    # each rank's RNG state (supervisor.rng), one file per rank

A save is a collective, called by every rank at the same step (the `CollectiveAgreement` makes
the step the same): the chief creates ``model.ckpt-100.tmp-<hex>/`` and broadcasts its path;
every rank runs ``dcp.save`` into it, checksums the files it wrote (still in the page cache) and
sends the records to the chief; the chief checksums ``.metadata``, seals the manifest naming
every file, renames the directory and publishes the index (retention as for ``state.pt``
checkpoints). A failure on any rank removes the temp directory on every rank's word and raises
`CheckpointError` everywhere; a crash leaves only the temp directory. Saves are synchronous (DCP's
``async_save`` stages into its own buffers and commits from a thread the commit protocol cannot
seal from all ranks at once; not used yet).

Restore: the chief chooses and verifies (§5.4: index first, full checksums, fall back to older),
broadcasts the path, and every rank loads exactly that with ``dcp.load`` — which reshards: the
world size may differ from the one that saved. `load_into` loads a DCP checkpoint into a plain
module or state in one process (evaluation, export), verified first.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping

import torch

from supervisor import distributed
from supervisor.checkpoint.fileio import checksum_file
from supervisor.checkpoint.format import FileRecord, checkpoint_name
from supervisor.checkpoint.restore import check_checkpoint, safe_torch_load
from supervisor.checkpoint.verify import DCP_METADATA
from supervisor.checkpoint.serialize import serialize
from supervisor.checkpoint.temp import TempCheckpoint
from supervisor.checkpoint.restore import Restored
from supervisor.creator import SessionCreator
from supervisor.errors import CheckpointError
from supervisor.rng import capture_rng_state
from supervisor.state import TrainingState, unwrap_module

__all__ = ["DCP_METADATA", "ShardedCheckpointManager", "ShardedSessionCreator", "choose_checkpoint", "load_into",
           "restore_sharded", "save_sharded"]

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
                 publish: Any = None, save_rng: bool = True) -> str:
    """Every rank's shards of ``state`` as the committed checkpoint ``<basename>-<step>``.

    A collective over the default group. ``publish(name, wall_time)`` runs on the chief after the
    rename (index and retention; e.g. a `CheckpointManager`'s). Returns the committed path.

    Raises:
        CheckpointError: on every rank, when any rank failed (the temp directory is removed).
    """
    import torch.distributed as dist

    group = distributed.is_initialized()  # without one: a single process writes alone
    rank, size = (distributed.rank(), distributed.world_size()) if group else (0, 1)
    name = checkpoint_name(basename, step)
    temp = TempCheckpoint.create(directory, name) if rank == 0 else None
    box = [temp.path if temp is not None else None]
    if group:
        dist.broadcast_object_list(box, src=0)
    path = box[0]
    outcome = _write_own_part(path, state, rank, group, save_rng)
    gathered: list[Any] | None = [None] * size if rank == 0 else None
    if group:
        dist.gather_object(outcome, gathered, dst=0)
    else:
        gathered = [outcome]
    verdict = [""]
    if temp is not None:
        verdict[0] = _seal(temp, gathered or [], step, wall_time, size, publish)
    if group:
        dist.broadcast_object_list(verdict, src=0)
    if verdict[0]:
        raise CheckpointError(f"saving the sharded checkpoint of step {step} to "
                              f"{os.path.join(directory, name)} failed: {verdict[0]}")
    return os.path.join(directory, name)


def _write_own_part(path: str, state: TrainingState, rank: int, group: bool,
                    save_rng: bool) -> tuple[bool, str, dict[str, tuple[int, str]]]:
    """This rank's part of a save: its DCP shards (fsynced by DCP), its RNG file, and the
    size and CRC-32 of each file it wrote (read back from the page cache). Never raises: the
    outcome goes to the chief."""
    import torch.distributed.checkpoint as dcp

    try:
        dcp.save(build_state_dict(state), storage_writer=dcp.FileSystemWriter(path, sync_files=True),
                 no_dist=not group)
        own = TempCheckpoint.attach(path)
        if save_rng:
            own.write_file(f"rng-{rank}.pt", lambda w: serialize(capture_rng_state(), w))
        records = {f: checksum_file(os.path.join(path, f)) for f in os.listdir(path) if f.startswith(f"__{rank}_")}
        records.update({f: (r.size, r.checksum) for f, r in own.records.items()})
        return True, "", records
    except Exception as e:  # noqa: BLE001 - reported to the chief, raised on every rank by save_sharded
        return False, f"rank {rank}: {type(e).__name__}: {e}", {}


def _seal(temp: TempCheckpoint, outcomes: list[Any], step: int, wall_time: float, size: int, publish: Any) -> str:
    """The chief's part: seal, rename, publish; returns "" or what failed."""
    failures = [message for ok, message, _ in outcomes if not ok]
    if failures:
        temp.discard()
        return "; ".join(failures)
    for _, _, records in outcomes:
        for rel, (nbytes, checksum) in records.items():
            temp.add_record(rel, FileRecord(int(nbytes), str(checksum)))
    try:
        result = temp.finalize(step=step, wall_time=wall_time, world_size=size)
        if publish is not None:
            publish(temp.name, wall_time)
    except Exception as e:  # noqa: BLE001 - reported to every rank
        return f"rank 0 (sealing): {type(e).__name__}: {e}"
    logger.info("committed the sharded checkpoint %s (%d ranks, %.1f MiB, %.2f s)", result.path, size,
                result.nbytes / 2**20, result.write_secs)
    return ""


# ---------------------------------------------------------------- restoring
def choose_checkpoint(directory: str, basename: str, *, verify: str = "full") -> tuple[str, int] | None:
    """The chief's choice (§5.4): the index's checkpoint if it verifies, else the next older one;
    None when there is none.

    Raises:
        CheckpointCorruptError: checkpoints exist but none verifies (each listed with why).
    """
    from supervisor.checkpoint.restore import _candidates  # the one rule for candidates
    from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError

    failures = []
    for path in _candidates(directory, basename):
        try:
            manifest = check_checkpoint(path, verify=verify)
        except (CheckpointNotFoundError, CheckpointCorruptError) as e:
            logger.warning("skipping checkpoint %s: %s", path, e)
            failures.append(f"{path}: {e}")
            continue
        return path, manifest.step
    if failures:
        raise CheckpointCorruptError(f"none of the checkpoints in {directory} can be restored ({'; '.join(failures)})")
    return None


def restore_sharded(path: str, state: TrainingState, *, step: int, restore_rng: bool = True) -> Restored:
    """Loads the DCP checkpoint at ``path`` into ``state`` on this rank (every rank calls it with
    the path the chief chose); DCP reshards to this job's world size."""
    import torch.distributed.checkpoint as dcp

    state_dict = build_state_dict(state)
    try:
        dcp.load(state_dict, checkpoint_id=path, no_dist=not distributed.is_initialized())
        apply_state_dict(state, state_dict)
    except Exception as e:
        raise CheckpointError(f"restoring the sharded checkpoint {path} (step {step}) failed: "
                              f"{type(e).__name__}: {e}") from e
    if restore_rng:
        _restore_rng(path, step)
    return Restored(global_step=step, path=path)


def _restore_rng(path: str, step: int) -> None:
    from supervisor.distributed.rng import restore_for_rank

    rank = distributed.rank()
    files = {int(f[4:-3]): f for f in os.listdir(path) if f.startswith("rng-") and f.endswith(".pt")}
    if not files:
        logger.warning("%s has no RNG state; the random generators continue from their current state", path)
        return
    if rank in files:
        states = {rank: safe_torch_load(os.path.join(path, files[rank]), step=step)}
    else:
        states = dict.fromkeys(files)  # only the keys matter: this rank gets the derived seed
    restore_for_rank(states, rank, step=step, where=f"{path} (step {step})")


def load_into(path: str | os.PathLike, target: Any, *, verify: str = "full") -> int:
    """Loads a DCP checkpoint into a plain, non-distributed module (its ``"model"`` entry) or
    `TrainingState` in this one process — for evaluation and export. Verifies it first.

    Returns:
        The checkpoint's step.
    """
    import torch.distributed.checkpoint as dcp

    path = os.fspath(path)
    manifest = check_checkpoint(path, verify=verify)
    if DCP_METADATA not in manifest.files:
        raise CheckpointError(f"{path} is not a sharded (checkpoint_format='dcp') checkpoint; use "
                              "supervisor.load_checkpoint or restore_partial")
    if isinstance(target, TrainingState):
        state_dict = build_state_dict(target)
        dcp.load(state_dict, checkpoint_id=path, no_dist=True)
        apply_state_dict(target, state_dict)
    else:
        module = unwrap_module(target)
        state_dict = {"model": module.state_dict()}
        dcp.load(state_dict, checkpoint_id=path, no_dist=True)
        module.load_state_dict(state_dict["model"])
    return manifest.step


# ---------------------------------------------------------------- manager and creator
class ShardedCheckpointManager:
    """The checkpoint manager of ``checkpoint_format="dcp"``: one on **every** rank.

    ``save`` is a collective (every rank writes its shards; `save_sharded`), synchronous, and
    reports the commit through ``on_commit(step, path)`` like `CheckpointManager`. The chief
    holds an inner `CheckpointManager` for what only it does: the ownership lock, cleaning up
    a crashed writer's temp directories, the index and retention. A failed save raises
    `CheckpointError` on every rank (``max_consecutive_save_failures`` does not apply).

    Args:
        directory, basename, max_to_keep, keep_checkpoint_every_n_hours, verify, save_rng,
        trusted_globals, clock: as `CheckpointManager`.
        max_wait_secs: how long a non-chief rank waits for the chief's restore decision.
    """

    collective = True  # every rank calls save() at the same step

    def __init__(self, directory: str | os.PathLike, *, basename: str = "model.ckpt",
                 max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float | None = 10000.0,
                 verify: str = "full", save_rng: bool = True, trusted_globals: Any = (),
                 max_wait_secs: float = 7200, clock: Any = None) -> None:
        from supervisor._validate import check_number
        from supervisor.checkpoint.manager import CheckpointManager
        from supervisor.clock import resolve_clock

        self._chief = distributed.rank() == 0
        inner = CheckpointManager(directory, basename=basename, max_to_keep=max_to_keep,
                                  keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
                                  save_mode="sync", verify=verify, save_rng=save_rng,
                                  trusted_globals=trusted_globals, clock=clock)
        self.directory, self.basename, self.verify = inner.directory, inner.basename, inner.verify
        self.save_rng = inner.save_rng
        self.max_wait_secs = check_number("max_wait_secs", max_wait_secs, minimum=0)
        self._inner = inner if self._chief else None
        self._clock = resolve_clock(clock)
        self.on_commit: Any = None
        self.on_error: Any = None
        self._last_saved_step: int | None = None

    @property
    def last_saved_step(self) -> int | None:
        return self._last_saved_step

    @property
    def checkpoints(self) -> tuple[str, ...]:
        return self._inner.checkpoints if self._inner is not None else ()

    def open(self) -> None:
        if self._inner is not None:
            self._inner.open()

    def save(self, step: int, state: TrainingState, *, wait: bool = False) -> str:
        """Every rank's shards of ``state`` at ``step`` (a collective; see the class docstring)."""
        publish = self._inner._publish if self._inner is not None else None
        path = save_sharded(self.directory, self.basename, int(step), state, wall_time=self._clock.time(),
                            publish=publish, save_rng=self.save_rng)
        self._last_saved_step = int(step)
        if self.on_commit is not None:
            self.on_commit(int(step), path)
        return path

    def wait(self) -> None:
        """Nothing in flight: sharded saves are synchronous."""

    def restore(self, state: TrainingState) -> Restored | None:
        """The chief chooses (verified, §5.4) and posts its choice; every rank loads exactly it."""
        from supervisor.distributed import restore as channel

        if not distributed.is_distributed():
            choice = choose_checkpoint(self.directory, self.basename, verify=self.verify)
        elif self._chief:
            key = channel.next_key()
            try:
                choice = choose_checkpoint(self.directory, self.basename, verify=self.verify)
            except BaseException as e:
                channel.publish_decision(key, channel.RestoreDecision(error=f"{type(e).__name__}: {e}"))
                raise
            channel.publish_decision(key, channel.RestoreDecision(*choice) if choice else channel.RestoreDecision())
        else:
            decision = channel.await_decision(channel.next_key(), max_wait_secs=self.max_wait_secs, clock=self._clock)
            if decision.error is not None:
                raise CheckpointError(f"rank {distributed.rank()} cannot restore: the chief's restore "
                                      f"failed with {decision.error}")
            choice = (decision.path, decision.step) if decision.path is not None else None
        if choice is None:
            return None
        restored = restore_sharded(choice[0], state, step=choice[1], restore_rng=self.save_rng)
        self._last_saved_step = restored.global_step
        return restored

    def close(self, *, failed: bool = False) -> None:
        if self._inner is not None:
            self._inner.close(failed=failed)


class ShardedSessionCreator(SessionCreator):
    """Restore-or-init from a `ShardedCheckpointManager`, on every rank (SPEC §4, §12).

    The chief chooses; every rank (chief or not) loads its shards of that checkpoint. Only the
    chief writes events; every rank takes part in each save.
    """

    reinitialise_on_recreate = True

    def __init__(self, state: TrainingState | None, manager: ShardedCheckpointManager, *, is_chief: bool,
                 init_fn: Any = None, local_init_fn: Any = None, ready_fn: Any = None,
                 logdir: str | None = None, summary_writer: Any = None) -> None:
        if not isinstance(manager, ShardedCheckpointManager):
            raise TypeError(f"manager must be a ShardedCheckpointManager, got {manager!r}")
        super().__init__(state, init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn,
                         is_chief=is_chief, logdir=logdir if logdir is not None else manager.directory,
                         summary_writer=summary_writer)
        self.environment.checkpoints = manager  # closed with the environment

    def restore(self, session: Any) -> Restored | None:
        self.checkpoints.open()
        return self.checkpoints.restore(self.state)
