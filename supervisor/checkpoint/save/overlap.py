"""Overlapped capture (SPEC §5.9): copy parameters and optimizer state while the next step runs.

Parameters and optimizer state change only inside ``optimizer.step()``. So at a save's boundary
only what can change elsewhere is copied blocking (module buffers, parameters no optimizer of
the state owns, every other object and the RNG: `staging.StagingArea` as before); the tensors the
optimizers own are copied into the same kept staging buffers by a `Copier` in the background —
a side CUDA stream (`StreamCopier`), or a side thread for CPU tensors (`ThreadCopier`) — while
step N+1's forward and backward run. `PendingCopy` then:

- registers, on every optimizer of the state, a step pre-hook (and ``state_dict`` /
  ``load_state_dict`` pre-hooks on the optimizers and modules) that *settles* the copy before
  anything writes: the training thread (CUDA: its current stream) waits for the copy, once;
- fingerprints the live tensors at the boundary, in the stream's order before the copy
  (fingerprint.py: a position-weighted 64-bit checksum of their bits, on their device), and the
  staged copy once the copy is done (on the CPU, on the writer thread): equal fingerprints mean
  the buffers hold the boundary's state, whatever wrote the live tensors before, during or after
  the copy (``p.data``, ``no_grad``, sign flips, permutations, views, aliases; no version counter
  is read);
- hands the writer thread the outcome (`PendingCopy.outcome`): the buffers are the boundary's
  state, or the names of the tensors whose copy differs — then the save is discarded, never
  committed torn.

The copier is injectable (``CheckpointManager(copier=...)``) so the overlap can be tested on a
CPU: a `ThreadCopier` whose ``copy_fn`` waits on an event forces a slow copy.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

from supervisor.checkpoint.save.copiers import Copier, CopyJob, DefaultCopier, StreamCopier, ThreadCopier, check_copier
from supervisor.checkpoint.save.fingerprint import Plan, fingerprints
from supervisor.checkpoint.arguments import CAPTURE_MODES, check_capture
from supervisor.state import unwrap_module

__all__ = ["CAPTURE_MODES", "Copier", "CopyJob", "DefaultCopier", "PendingCopy", "StreamCopier", "ThreadCopier", "check_capture",
           "check_copier", "deferred_tensors", "discarded_message", "plan", "resolve_capture", "start"]

logger = logging.getLogger(__name__)

# How often a writer waiting for the training thread's settle looks whether that thread is gone,
# and how long it waits for that settle to name it in a discarded save's diagnostic.
_SETTLE_POLL_SECS = 0.1
_SETTLE_DIAGNOSTIC_SECS = 30.0
# "auto" overlaps CUDA tensors only once the CUDA path has passed its tests on a GPU (SPEC §5.9):
# tests/checkpoint/test_overlapped_*.py's "cuda" variants and benchmarks/gpu.py have not yet run.
AUTO_OVERLAPS_ON_CUDA = False


def discarded_message(step: int, moved: Sequence[str]) -> str:
    shown = ", ".join(moved[:5]) + (f" and {len(moved) - 5} more" if len(moved) > 5 else "")
    return (f"discarding the checkpoint of step {step} (the committed checkpoints are intact): the overlapped "
            f"capture's copy of {shown} differs from its state at the boundary — an in-place write outside "
            "optimizer.step() (e.g. p.data.clamp_() before the optimizer's step) landed before or during the "
            "copy. Code that writes parameters or optimizer state outside optimizer.step() should use "
            "capture='blocking'")


def resolve_capture(capture: str, tensors: Sequence[torch.Tensor]) -> str:
    """"auto" → "blocking" (until `AUTO_OVERLAPS_ON_CUDA`: "overlapped" when any of the
    optimizers' ``tensors`` is on CUDA); "overlapped" stays opt-in."""
    if capture != "auto":
        return capture
    cuda = any(t.device.type == "cuda" for t in tensors)
    return "overlapped" if AUTO_OVERLAPS_ON_CUDA and cuda else "blocking"


def plan(state: Any, capture: str) -> tuple[list[Any], frozenset[tuple]]:
    """What a capture of ``state`` with ``capture=`` leaves for the background copy: the objects
    to hook (its optimizers and modules) and the `alias_key` of each tensor to copy late.
    Nothing (a blocking capture) when the state has no optimizer or the mode resolves to
    "blocking"; "auto" overlaps only CUDA tensors (a CPU tensor, e.g. Adam's ``step``, is copied
    at the boundary)."""
    if capture == "blocking" or (capture == "auto" and not (AUTO_OVERLAPS_ON_CUDA and torch.cuda.is_initialized())):
        return [], frozenset()  # (no CUDA tensor exists before CUDA is initialised)
    optimizers = [o for o in state.values() if isinstance(o, torch.optim.Optimizer)]
    tensors = deferred_tensors(optimizers)
    mode = resolve_capture(capture, tensors)
    if mode == "blocking" or not tensors:
        return [], frozenset()
    keys = frozenset(alias_key(t) for t in tensors if capture == "overlapped" or t.device.type == "cuda")
    modules = [m for m in (unwrap_module(o) for o in state.values()) if isinstance(m, torch.nn.Module)]
    return [*optimizers, *modules], keys


def deferred_tensors(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The tensors only ``optimizer.step()`` writes: the parameters the optimizers own and their
    state (DTensors as their local shards)."""
    out = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            out.extend(_local(p) for p in group["params"])
        for per_param in optimizer.state.values():
            if isinstance(per_param, dict):
                out.extend(_local(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return out


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) and type(tensor) is not torch.Tensor else tensor


def alias_key(tensor: torch.Tensor) -> tuple:
    """What identifies one view of one tensor across ``detach()`` and state dicts."""
    return (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)


class PendingCopy:
    """A save's background copy of the optimizers' tensors, from the boundary to its verdict.

    Created on the training thread at the boundary (it queues the live tensors' fingerprints,
    then starts the copy). `settle` (training thread: the hooks, or the manager before its next
    save, ``wait``, ``restore`` and ``close``) orders the training side after the copy; `outcome`
    (writer thread) waits for the copy, fingerprints the staged buffers and names the tensors
    whose copy is not the boundary's state. `release` removes the hooks (training thread,
    outside any hook).

    Args:
        names: a printable name per tensor (``model.0.weight``, ``optimizer.state.0.exp_avg``).
        dst, src: the staging buffers and the live tensors.
        copier: starts the copy.
        objects: the optimizers and modules whose step / state_dict / load_state_dict must wait.
        host_events: CUDA events the writer waits for too (the blocking part's queued copies).
    """

    def __init__(self, names: list[str], dst: list[torch.Tensor], src: list[torch.Tensor], copier: Copier,
                 objects: Sequence[Any], host_events: Sequence[Any] = ()) -> None:
        self._host_events = list(host_events)
        self._names = names
        self._dst = dst
        self._src: list[torch.Tensor] | None = src
        self._plan = Plan(src)
        boundary = fingerprints(self._plan, src)  # in the stream's order, before the copy
        self._boundary = {device: _to_host(values, device) for device, (_, values) in boundary.items()}
        self._owner = threading.current_thread()
        self._boundary_time = time.perf_counter()
        self._settled_how = "not settled"
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._handles = _register_hooks(objects, before_write=self._before_write, before_read=self._before_read)
        self._job = copier.start(dst, src)

    def _before_write(self, *args: Any, **kwargs: Any) -> None:
        """``step()`` / ``load_state_dict()``: whichever thread is about to write settles (on
        CUDA its own current stream, which runs the write, then waits for the copy). Returns
        None: the hooked call goes on unchanged."""
        self.settle(how="an optimizer step() / load_state_dict() pre-hook")

    def _before_read(self, *args: Any, **kwargs: Any) -> None:
        """``state_dict()``: on the training thread, a settle; another thread (a summary
        service reading the model) only waits for the copy on the host and leaves the settle,
        whose stream wait follows the training thread's stream, to that thread."""
        if threading.current_thread() is self._owner:
            self.settle(how="a state_dict() pre-hook")
        elif not self._settled.is_set():
            try:
                self._job.wait_host()
            except Exception:  # noqa: BLE001 - the copy's failure is the writer's to report
                pass

    def settle(self, how: str = "the checkpoint manager (save/wait/restore/close)") -> None:
        """Makes the training side wait for the copy (after this, the live tensors may be
        written); ``how``: who settles, named with the thread and the time when a save is
        discarded."""
        if self._settled.is_set():
            return
        with self._lock:
            if self._settled.is_set() or self._src is None:
                return
            self._src = None
            self._job.settle()
            self._settled_how = (f"settled by {how} on thread {threading.current_thread().name!r} "
                                 f"{time.perf_counter() - self._boundary_time:.3f} s after the boundary")
            self._settled.set()

    def outcome(self) -> list[str]:
        """On the writer thread: waits for the copy and compares the staged buffers'
        fingerprints with the live tensors' at the boundary; returns the names of the tensors
        whose copy differs (empty: the buffers hold the boundary's state, bit for bit).

        Raises:
            BaseException: the copy's own error.
        """
        for event in self._host_events:
            event.synchronize()
        self._job.wait_host()
        copied = time.perf_counter() - self._boundary_time
        names = self._differing()
        if names:  # what a report of a discarded save needs to tell a real write from a race
            self._wait_for_settle()
            logger.warning("the overlapped copy whose %d tensor(s) differ from the boundary's state finished %.3f s "
                           "after the boundary and was %s", len(names), copied, self._settled_how)
        return names

    def _differing(self) -> list[str]:
        staged = fingerprints(self._plan, self._dst)
        names = []
        for device, (indices, after) in staged.items():
            before, event = self._boundary[device]
            if event is not None:
                event.synchronize()
            names.extend(self._names[indices[j]] for j in (before != after).nonzero().flatten().tolist())
        return list(dict.fromkeys(names))

    def _wait_for_settle(self) -> None:
        deadline = time.monotonic() + _SETTLE_DIAGNOSTIC_SECS
        while not self._settled.wait(_SETTLE_POLL_SECS) and time.monotonic() < deadline:
            if not self._owner.is_alive():  # the training thread is gone: nothing writes any more
                self.settle(how="the writer (the training thread had ended)")

    def release(self) -> None:
        """Removes the hooks (the training thread, never from inside one of them)."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()


def start(deferral: Any, objects: Sequence[Any], copier: Copier) -> PendingCopy | None:
    """Starts the background copy of what a capture deferred (a `staging.Deferral`); None when
    it deferred nothing (then the blocking part's queued copies are waited for here)."""
    if not deferral.items:
        for event in deferral.events:
            event.synchronize()
        return None
    src = [d.source for d in deferral.items]
    return PendingCopy([d.name for d in deferral.items], [d.buffer for d in deferral.items], src, copier,
                       objects, deferral.events)


def _to_host(values: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
    """``values`` on the host; for CUDA a queued copy into pinned memory and the event after it
    (no host sync on the training thread)."""
    if device.type != "cuda":
        return values, None
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return host, event


def _register_hooks(objects: Sequence[Any], *, before_write: Callable[..., None],
                    before_read: Callable[..., None]) -> list[Any]:
    """The step pre-hook of every optimizer and the state_dict / load_state_dict pre-hooks of
    every optimizer and module (each returns None, so the hooked call is unchanged)."""
    # Opaque to torch.compile: traced into a compiled ``optimizer.step``, the hook's stream wait
    # (CUDA) was not ordered before the compiled step's writes, and the copy read step n+1.
    before_write = torch.compiler.disable(before_write)
    before_read = torch.compiler.disable(before_read)
    handles = []
    for obj in objects:
        if isinstance(obj, torch.optim.Optimizer):
            handles.append(obj.register_step_pre_hook(before_write))
        handles.append(obj.register_load_state_dict_pre_hook(before_write))
        handles.append(obj.register_state_dict_pre_hook(before_read))
    return handles
