"""One sharded save through the commit protocol, on every rank (SPEC §5.1, §12).

`commit` is one rank's part of a ``checkpoint_format="dcp"`` save. It runs on the training
thread (a synchronous save) or on the checkpoint writer's background thread (an asynchronous
one; `stage` copied the state into CPU buffers first, on the training thread). Either way:

1. the chief stages the checkpoint (`TempCheckpoint.create`: locally ``<name>.tmp-<hex>/``; on
   an object store the checkpoint's own prefix, cleared of a crashed writer's leftovers) and
   posts its path; the other ranks wait for it;
2. every rank runs ``dcp.save`` into it (its ``__<rank>_*.distcp`` shards; the chief's DCP
   coordinator also writes ``.metadata``), writes ``rng-<rank>.pt`` and posts the size and
   CRC-32 of each file it wrote, computed while writing (locally fsynced by DCP; on an object
   store uploaded through the logdir's `Storage`:
   `supervisor.checkpoint.formats.dcp_storage.StorageDcpWriter`), and the CRC-32 of each item in DCP's
   ``.metadata`` (`supervisor.checkpoint.formats.dcp_ranges`: a restore verifies the ranges it reads);
3. the chief waits for every rank's records — or the first failure — then seals the manifest
   naming every file, checks its lease, commits (locally: manifest, rename; on an object store:
   ``MANIFEST.json`` written last, create-only), publishes (index, retention) and posts its
   verdict; the other ranks wait for the verdict, so every rank reports the same outcome.

The small messages (path, records, verdict) travel through the process group's store, never
a collective on the default group: from a background thread that would race the training
thread's collectives (DDP's, the agreement's). ``dcp.save``'s own collectives (planning, the
final metadata gather) run on ``group``: a gloo group of the manager's own for background
saves, the default group for saves on the training thread. Until the chief has every rank's
records nothing is sealed, so a crash or a SIGKILL at any point leaves only the temp directory
or a manifest-less prefix (removed, with a WARNING, when a writer next opens the logdir), never
a published incomplete checkpoint.

Store keys are ``supervisor/dcp/<agreed round>/<save number>/...`` (`distributed.env.agreed_key`,
numbered by the process group): every rank numbers its saves in the same order (`next_save_key`, called on the training thread), as they are
collectives. The chief deletes the keys of save n-1 once every rank's records of save n arrived
(every rank has then left save n-1).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from supervisor import distributed
from supervisor.checkpoint.layout.format import FileRecord
from supervisor.checkpoint.formats.serialize import serialize
from supervisor.checkpoint.save.staging import StagingArea
from supervisor.checkpoint.storage import Storage, storage_for
from supervisor.checkpoint.save.temp import TempCheckpoint
from supervisor.errors import CheckpointError

__all__ = ["Channel", "ShardedSave", "commit", "next_save_key", "stage"]

logger = logging.getLogger(__name__)

_POLL_SECS = (0.002, 0.05)  # first and longest pause between two looks at the store


def next_save_key() -> str:
    """The store namespace of this process's next sharded save (call once per save, on every rank)."""
    return distributed.env.agreed_key("dcp")


# ---------------------------------------------------------------- staging
def stage(tree: Any, area: StagingArea) -> Any:
    """A copy of a DCP state dict in ``area``'s reused CPU buffers (the training thread's part of
    an asynchronous save). A DTensor is staged as its local shard and re-wrapped with the same
    mesh, placements, global shape and stride — no collective, and its buffer is reused too."""
    specs: dict[tuple, tuple] = {}
    staged = area.capture(_unwrap(tree, (), specs))
    return _rewrap(staged, (), specs) if specs else staged


def _unwrap(value: Any, path: tuple, specs: dict[tuple, tuple]) -> Any:
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(value, dtensor):
        specs[path] = (value.device_mesh, tuple(value.placements), value.shape, value.stride())
        return value.to_local().detach()
    return _rebuild(value, path, specs, _unwrap)


def _rewrap(value: Any, path: tuple, specs: dict[tuple, tuple]) -> Any:
    if path in specs:
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = specs[path]
        return DTensor.from_local(value, mesh, placements, run_check=False, shape=shape, stride=stride)
    return _rebuild(value, path, specs, _rewrap)


def _rebuild(value: Any, path: tuple, specs: dict, visit: Callable[..., Any]) -> Any:
    if isinstance(value, dict):
        out = type(value)((k, visit(v, path + (k,), specs)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata  # type: ignore[attr-defined]
        return out
    if type(value) is list or type(value) is tuple:
        return type(value)(visit(v, path + (i,), specs) for i, v in enumerate(value))
    return value


def _dtensor_type() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed support
        return None
    return DTensor


# ---------------------------------------------------------------- messages between ranks
class Channel:
    """The small messages of a save: JSON values under keys of the process group's store
    (``store``), or of a dict when there is no process group (one process).

    Args:
        store: the store (None: in-process).
        abort: when set, a rank waiting for a message gives up at once (its manager is
            closing after an error).
    """

    def __init__(self, store: Any = None, abort: threading.Event | None = None) -> None:
        self._store = store
        self._local: dict[str, str] = {}
        self.abort = abort or threading.Event()

    def post(self, key: str, value: Any) -> None:
        text = json.dumps(value)
        if self._store is None:
            self._local[key] = text
        else:
            self._store.set(key, text)

    def wait(self, key: str, *, deadline: float, what: str) -> Any:
        """The value under ``key`` once posted. Raises `CheckpointError` at ``deadline``
        (``time.monotonic()``) or when `abort` is set, naming ``what`` it waited for."""
        pause = _POLL_SECS[0]
        while True:
            if self._store is None:
                if key in self._local:
                    return json.loads(self._local[key])
            elif self._store.check([key]):
                value = self._store.get(key)
                return json.loads(value.decode("utf-8") if isinstance(value, bytes) else value)
            if self.abort.is_set():
                raise CheckpointError(f"stopped waiting for {what} (store key {key!r}): the checkpoint "
                                      "manager is closing after an error")
            if time.monotonic() >= deadline:
                raise CheckpointError(f"gave up waiting for {what} (store key {key!r}) at the save's "
                                      "timeout (save_timeout_secs)")
            self.abort.wait(pause)
            pause = min(pause * 2, _POLL_SECS[1])

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            if self._store is None:
                self._local.pop(key, None)
                continue
            try:
                self._store.delete_key(key)
            except Exception as e:  # noqa: BLE001 - a few stale bytes in the store, nothing more
                logger.debug("could not delete the store key %s: %s", key, e)


# ---------------------------------------------------------------- one rank's part
@dataclass
class ShardedSave:
    """What one rank saves: ``state_dict`` (live or staged), this rank's ``rng`` state (None:
    ``save_rng=False``), and where: ``<directory>/<name>``, store namespace ``key``."""

    directory: str
    name: str
    step: int
    wall_time: float
    state_dict: Any
    rng: Any
    key: str
    rank: int = 0
    world_size: int = 1
    group: Any = None
    timeout_secs: float = 1800.0
    publish: Callable[[str, float], Any] | None = field(default=None, repr=False)
    before_commit: Callable[[], Any] | None = field(default=None, repr=False)  # the chief's lease check
    generation: int | None = None  # the chief's lease generation (fences its late writes: fencing.py)
    storage: Storage | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.storage is None:
            self.storage = storage_for(self.directory)

    @property
    def path(self) -> str:
        return self.storage.join(self.directory, self.name)  # type: ignore[union-attr]


def commit(save: ShardedSave, channel: Channel) -> str:
    """This rank's part of ``save`` (the module docstring); returns the committed path.

    Raises:
        CheckpointError: the save failed — on every rank, with the chief's verdict (the temp
            directory is removed); or this rank gave up waiting (timeout, abort), or could not
            reach the store.
    """
    deadline = time.monotonic() + save.timeout_secs
    try:
        if save.rank == 0:
            verdict = _chief(save, channel, deadline)
        else:
            message = channel.wait(f"{save.key}/path", deadline=deadline, what="the chief's temp directory")
            verdict = message.get("error", "")
            if not verdict:
                channel.post(f"{save.key}/rank-{save.rank}", write_own_part(message["path"], save))
                verdict = channel.wait(f"{save.key}/verdict", deadline=deadline, what="the chief's commit")["error"]
    except CheckpointError as e:
        raise CheckpointError(_failed(save, str(e))) from e
    except Exception as e:  # noqa: BLE001 - e.g. the store is gone with the chief
        raise CheckpointError(_failed(save, f"rank {save.rank}: {type(e).__name__}: {e}")) from e
    if verdict:
        raise CheckpointError(_failed(save, verdict))
    return save.path


def _failed(save: ShardedSave, why: str) -> str:
    return f"saving the sharded checkpoint of step {save.step} to {save.path} failed: {why}"


def _chief(save: ShardedSave, channel: Channel, deadline: float) -> str:
    """The chief's part: temp directory, own files, the others' records, seal; the verdict is
    posted whatever happens (an unexpected error too), so no rank waits for it in vain."""
    try:
        temp = TempCheckpoint.create(save.directory, save.name, save.storage, generation=save.generation)
    except OSError as e:
        verdict = f"rank 0 cannot create the temp directory: {type(e).__name__}: {e}"
        channel.post(f"{save.key}/path", {"error": verdict})
        return verdict
    try:
        channel.post(f"{save.key}/path", {"path": temp.path})
        return _chief_part(temp, save, write_own_part(temp.path, save), channel, deadline)
    except BaseException as e:
        temp.discard()
        try:
            channel.post(f"{save.key}/verdict", {"error": f"rank 0: {type(e).__name__}: {e}"})
        except Exception:  # noqa: BLE001 - the store is gone: the others fail on it too
            pass
        raise


def write_own_part(path: str, save: ShardedSave) -> dict[str, Any]:
    """This rank's files: its DCP shards, its RNG file, and the size and CRC-32 of each. Never
    raises: the outcome goes to the chief.

    Locally DCP's ``FileSystemWriter`` fsyncs the shards, checksummed while written; on an object store (``storage.is_object_store``) the shards are uploaded by
    `supervisor.checkpoint.formats.dcp_storage.StorageDcpWriter`, checksummed while written (no read)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    try:
        storage = save.storage
        own = TempCheckpoint(storage.dirname(path), storage.basename(path), path, storage)  # type: ignore[union-attr]
        if storage.is_object_store:  # type: ignore[union-attr]
            records = _save_to_object_store(path, save, storage)  # type: ignore[arg-type]
        else:
            records = _save_to_directory(path, save)
        if save.rng is not None:
            own.write_file(f"rng-{save.rank}.pt", lambda w: serialize(save.rng, w))
        records.update({f: [r.size, r.checksum] for f, r in own.records.items()})
        return {"ok": True, "message": "", "records": records}
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - reported to the chief, raised on every rank
        return {"ok": False, "message": f"rank {save.rank}: {_describe(e)}", "records": {}}


def _save_to_directory(path: str, save: ShardedSave) -> dict[str, list]:
    """``dcp.save`` into a local temp directory (fsynced by DCP); each shard's size and CRC-32
    computed while it is written, and each item's CRC-32 kept in ``.metadata``
    (`supervisor.checkpoint.formats.dcp_ranges`: nothing read back; ``.metadata`` is checksummed by
    the chief's seal)."""
    import torch.distributed.checkpoint as dcp

    from supervisor.checkpoint.formats.dcp_ranges import ItemChecksums  # lazy: imports DCP

    class Writer(ItemChecksums, dcp.FileSystemWriter):
        pass

    writer = Writer(path, sync_files=True)
    writer.record_items()
    dcp.save(save.state_dict, storage_writer=writer, process_group=save.group,
             no_dist=not distributed.is_initialized())
    return {f: [r.size, r.checksum] for f, r in writer.file_records(f"__{save.rank}_").items()}


def _save_to_object_store(path: str, save: ShardedSave, storage: Storage) -> dict[str, list]:
    """``dcp.save`` uploading into the checkpoint prefix; the records of every file this rank
    wrote (on the chief ``.metadata`` too), computed while uploading."""
    import torch.distributed.checkpoint as dcp

    from supervisor.checkpoint.formats.dcp_storage import StorageDcpWriter  # lazy: imports DCP

    writer = StorageDcpWriter(storage, path)
    dcp.save(save.state_dict, storage_writer=writer, process_group=save.group,
             no_dist=not distributed.is_initialized())
    return {f: [r.size, r.checksum] for f, r in writer.records.items()}


def _describe(error: BaseException) -> str:
    """One line per failed rank of DCP's `CheckpointException` (its str is a traceback per rank)."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        errors = {r: f[0] if isinstance(f, tuple) else f for r, f in failures.items()}  # (exception, trace)
        return "; ".join(f"DCP on rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items()))
    return f"{type(error).__name__}: {error}"


def _chief_part(temp: TempCheckpoint, save: ShardedSave, own: dict, channel: Channel, deadline: float) -> str:
    """Collects every rank's records (stopping at the first failure), seals or discards, posts
    the verdict; returns it ("" when committed)."""
    outcomes = [own]
    failure = "" if own["ok"] else own["message"]
    for rank in range(1, save.world_size):
        if failure:
            break
        try:
            outcome = channel.wait(f"{save.key}/rank-{rank}", deadline=deadline, what=f"rank {rank}'s files")
        except CheckpointError as e:
            failure = f"rank {rank} did not report its files: {e}"
            break
        outcomes.append(outcome)
        failure = "" if outcome["ok"] else outcome["message"]
    if not failure and channel.abort.is_set():  # the manager closed after an error: publish nothing
        failure = "rank 0: the checkpoint manager is closing after an error; not sealed"
    if failure:
        temp.discard()
        verdict = failure
    else:
        verdict = _seal(temp, outcomes, save)
    channel.post(f"{save.key}/verdict", {"error": verdict})
    if not failure:  # every rank has left the previous save: its keys can go
        number = int(save.key.rsplit("/", 1)[1])
        if number > 0:
            previous = f"{save.key.rsplit('/', 1)[0]}/{number - 1}"
            channel.delete([f"{previous}/path", f"{previous}/verdict",
                            *(f"{previous}/rank-{r}" for r in range(1, save.world_size))])
    return verdict


def _seal(temp: TempCheckpoint, outcomes: list[dict], save: ShardedSave) -> str:
    """Seal, rename, publish; returns "" or what failed."""
    for outcome in outcomes:
        for rel, (nbytes, checksum) in outcome["records"].items():
            temp.add_record(rel, FileRecord(int(nbytes), str(checksum)))
    try:
        result = temp.finalize(step=save.step, wall_time=save.wall_time, world_size=save.world_size,
                               before_commit=save.before_commit)
    except Exception as e:  # noqa: BLE001 - reported to every rank
        return f"rank 0 (sealing): {type(e).__name__}: {e}"
    try:
        if save.publish is not None:
            save.publish(temp.name, save.wall_time)
    except Exception as e:  # noqa: BLE001 - reported to every rank
        return f"rank 0: committed {result.path} but publishing it failed: {type(e).__name__}: {e}"
    logger.debug("committed the sharded checkpoint %s (%d ranks, %.1f MiB, %.2f s)", result.path,
                save.world_size, result.nbytes / 2**20, result.write_secs)
    return ""


def side_group(timeout_secs: float) -> Any:
    """A gloo group of every rank for ``dcp.save``'s collectives from a background thread (a
    collective: every rank calls it at the same point, on its training thread)."""
    import datetime

    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_secs))


def rank_and_size() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if distributed.is_initialized():
        return distributed.rank(), distributed.world_size()
    return 0, 1


def channel_for(abort: threading.Event | None = None) -> Channel:
    """The store's channel with a process group, an in-process one without."""
    return Channel(distributed.default_store() if distributed.is_initialized() else None, abort)
