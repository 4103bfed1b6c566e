"""Ranks of the sharded tier tests: ``python -m tests.tiers.tier_sharded_worker dcp_tiers LOGDIR
LOCAL LAST_STEP PERSIST_EVERY CRASH [KIND]``, registering into tests/distributed/worker.py's
scenarios. A sharded model (``checkpoint_format="dcp"``) saved every step to the rank's node-local
tier ``LOCAL/node<rank>`` (``LOCAL/node<n>`` with ``NODE=n`` set: a torchrun node), persisted every
PERSIST_EVERY steps. ``CRASH=yes`` ends every rank with ``os._exit`` after the last local commit
and the copies already started, before the final copy a close would make. The RESULT line has
the full model, optimizer and RNG state after the restore and at the end (bit-exact checks).

Kill seam (these tests only; the library runs unchanged): ``TIER_KILL="point:n:rank"`` SIGKILLs
rank ``rank`` the ``n``-th time it reaches ``point``:

============  =====================================================================
part-seal     its local part written and fsynced, before its manifest and rename
part-mark     its part committed and the chief's commit posted, before its mark
copy-write    a file of its persist copy half sent to the logdir (persist thread)
copy-seal     (the chief) every rank's copy arrived, before the merged metadata and seal
============  =====================================================================

``NODE_LOSS="step:mark"`` (torchrun): the node of group rank 1, the first time (no file
``mark``), kills its agent and itself in ``step``'s ``after_run`` once the save in flight (the
previous step's) is committed: a lost node.
``TIER_LOCAL_DIR`` (torchrun): the node's local tier, instead of ``LOCAL/node<rank>``.
``S3_ENDPOINT``: the logdir is an ``s3://`` URL on that server (moto).
``TIER_STOP_GRACE``: the session's ``stop_grace_secs`` (default 30), the bound on noticing a
killed rank that no collective reports (its heartbeat stops: grace + a ping of grace / 4).
``RESTORE_STEP``: the front door's ``restore_step=`` (that step, not the newest).
``PEER_REPLICAS=1``: ``peer_replicas=True``; with ``LOCAL_WORLD_SIZE=n`` the local tier is
``LOCAL/node<rank // n>`` (n ranks per "node"), and ``TIER_KILL`` also knows ``peer-swap`` (a
chunk of a replica in flight between two ranks, on the replication thread).
``HOLD_COPY=step``: each rank's copy of that step to the logdir waits until the training loop
ended and its last save committed (a slow logdir, by a handshake). The RESULT also lists each
rank's local parts after the close (``parts``)."""
from __future__ import annotations

import hashlib
import os
import signal
import threading

import torch
import torch.distributed as dist

from tests.tiers.kill_switch import KillSwitch
from tests.distributed.worker import emit, main, scenario, sharded, train_sharded_step


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """SHA-256 of the full (gathered) parameters and optimizer state: a collective."""
    h = hashlib.sha256()
    names = {id(p): n for n, p in model.named_parameters()}
    order = [(names.get(id(p), ""), optimizer.state[p]) for g in optimizer.param_groups for p in g["params"]]
    tensors = list(model.state_dict().items()) + [(f"{n}.{k}", v) for n, s in order for k, v in sorted(s.items())]
    for name, tensor in tensors:
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        h.update(name.encode())
        h.update(full.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


POINTS = ("part-seal", "part-mark", "copy-write", "copy-seal")
_switch = KillSwitch("TIER_KILL", rank=dist.get_rank)
_reached = _switch.reached
_released = threading.Event()  # HOLD_COPY: the loop ended


def install_seams() -> None:
    from supervisor.checkpoint.save import temp
    from supervisor.checkpoint.tiers import sharded_parts

    finalize, mark, stream, merged = (temp.TempCheckpoint.finalize, sharded_parts.mark_committed,
                                      sharded_parts._stream, sharded_parts.merged_metadata)

    def finalize_(self, **kwargs):
        if threading.current_thread().name == "supervisor-dcp-writer":
            _reached("part-seal")
        return finalize(self, **kwargs)

    def mark_(path):
        _reached("part-mark")
        return mark(path)

    def stream_(storage, path, writer):
        return stream(storage, path, _switch.half_writer(writer, "copy-write"))

    def merged_(*args):
        _reached("copy-seal")
        return merged(*args)

    from supervisor.checkpoint.tiers import peer_link

    swap = peer_link.Link.swap

    def swap_(self, out, into):
        if threading.current_thread() is not threading.main_thread():
            _reached("peer-swap")
        return swap(self, out, into)
    peer_link.Link.swap, peer_link.CHUNK_BYTES = swap_, 1 << 10
    copy = sharded_parts.copy_part

    def copy_(part, *args):
        if os.path.basename(part) == f"model.ckpt-{os.environ.get('HOLD_COPY')}":
            assert _released.wait(120), "HOLD_COPY: the loop did not end"
        return copy(part, *args)
    sharded_parts.copy_part = copy_
    temp.TempCheckpoint.finalize, sharded_parts.mark_committed = finalize_, mark_
    sharded_parts._stream, sharded_parts.merged_metadata = stream_, merged_
    sharded_parts.COPY_CHUNK_BYTES = 1 << 10


def _node_loss(manager_of) -> list:
    """The hook of ``NODE_LOSS`` (module docstring), or none."""
    spec = os.environ.get("NODE_LOSS", "")
    if not spec or os.environ.get("GROUP_RANK") != "1" or os.path.exists(spec.split(":", 1)[1]):
        return []
    from supervisor import Hook

    step, mark = int(spec.split(":", 1)[0]), spec.split(":", 1)[1]

    class NodeLoss(Hook):
        def after_run(self, run_context, run_values) -> None:
            if run_context.session.global_step == step:
                manager_of().wait()  # the save in flight (step - 1), committed on every rank
                with open(mark, "w") as f:
                    f.write("lost")
                print(f"node of group rank 1 lost after step {step}", flush=True)
                os.kill(os.getppid(), signal.SIGKILL)  # its agent
                os.kill(os.getpid(), signal.SIGKILL)
    return [NodeLoss()]


def _node() -> int:
    return dist.get_rank() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _restore_step() -> int | None:
    step = os.environ.get("RESTORE_STEP")
    return None if step is None else int(step)


@scenario
def dcp_tiers(logdir: str, local: str, last_step: str, persist_every: str, crash: str, kind: str = "dtensor") -> None:
    import hooks
    from supervisor import MonitoredTrainingSession

    install_seams()
    model, optimizer = sharded(0, kind)
    torch.manual_seed(1000 + dist.get_rank())  # each rank's own RNG stream (a restore replaces it)
    sessions: list = []
    loss = _node_loss(lambda: sessions[0].checkpoint_manager)
    endpoint = os.environ.get("S3_ENDPOINT")  # an s3:// logdir on the test's moto server
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"} if endpoint else None
    with MonitoredTrainingSession(logdir, model=model, optimizer=optimizer, checkpoint_format="dcp",
                                  local_dir=os.environ.get("TIER_LOCAL_DIR", f"{local}/node{_node()}"),
                                  peer_replicas=os.environ.get("PEER_REPLICAS") == "1",
                                  persist_every_steps=int(persist_every), save_checkpoint_steps=1,
                                  storage_options=options, restore_step=_restore_step(),
                                  hooks=[hooks.StopAtStepHook(last_step=int(last_step)), *loss],
                                  log_step_count_steps=None, save_summaries_steps=None,
                                  stop_grace_secs=float(os.environ.get("TIER_STOP_GRACE", "30")),
                                  max_wait_secs=120) as s:
        sessions.append(s)
        start, start_digest = s.global_step, digest(model, optimizer)
        first_draw = torch.rand(1).item()
        while not s.should_stop():
            s.run(lambda: train_sharded_step(model, optimizer, s.global_step))
        if crash == "yes":
            s.checkpoint_manager.wait()  # the last step's local commit
            s.checkpoint_manager._persister.flush(120)  # the copies already started
            if hasattr(s.checkpoint_manager, "wait_replicas"):
                s.checkpoint_manager.wait_replicas(120)  # the replicas already started
            dist.barrier()
            emit({"start": start, "digest": start_digest, "first_draw": first_draw, "end": s.global_step,
                  "end_digest": digest(model, optimizer), "next_draw": torch.rand(1).item()})
            os._exit(0)
        end = s.global_step
        s.checkpoint_manager.wait()  # the last step's local commit
        _released.set()
    root = sessions[0].checkpoint_manager.part_root
    emit({"start": start, "digest": start_digest, "first_draw": first_draw, "end": end,
          "end_digest": digest(model, optimizer), "next_draw": torch.rand(1).item(), "parts": sorted(os.listdir(root))})


@scenario
def dcp_tier_copy_failures(logdir: str, local: str, last_step: str, max_failures: str) -> None:
    """`ShardedTieredCheckpointManager` used directly: saves steps 0..LAST_STEP (each waited for,
    each due for a copy, the copy waited for) with ``max_consecutive_save_failures=MAX_FAILURES``
    ("none": None); the RESULT names the step whose save raised and the error (or None)."""
    from supervisor.checkpoint.tiers.sharded import ShardedTieredCheckpointManager
    from supervisor.errors import CheckpointError
    from supervisor.state import TrainingState

    model, optimizer = sharded(0, "dtensor")
    state = TrainingState.from_arguments(model=model, optimizer=optimizer)
    endpoint = os.environ.get("S3_ENDPOINT")
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"} if endpoint else None
    manager = ShardedTieredCheckpointManager(
        logdir, local_dir=f"{local}/node{dist.get_rank()}", persist_every_steps=1, local_max_to_keep=1,
        max_consecutive_save_failures=None if max_failures == "none" else int(max_failures),
        storage_options=options)
    manager.open()
    error, step = None, 0
    try:
        for step in range(int(last_step) + 1):
            train_sharded_step(model, optimizer, step)
            manager.save(step, state, wait=True)
            assert manager._persister.flush(120)
        manager.wait()
    except CheckpointError as e:
        error = str(e)
    finally:
        manager.close(failed=error is not None)
    emit({"error": error, "step": step, "parts": sorted(os.listdir(manager.part_root))})


if __name__ == "__main__":
    main()
