"""The agreement's flags carried inside DDP's own gradient all-reduce (SPEC §12, §14).

A separate collective per step, even asynchronous, costs a DDP step of a small model on gloo
about half again (measured on 2 CPU cores: a bare async all_reduce per step 1.5×), because every
collective wakes the transport's threads on every rank. DDP already runs a collective in every
step's backward: `GradientChannel` is a DDP communication hook that appends the agreement's
``2 × world_size`` flags to the first gradient bucket, so they travel in the same all-reduce at
no extra round trip, and are known on every rank when ``backward()`` returns.

Gradients are unchanged: the hook averages every bucket as DDP's built-in reducer does (a
multiplication by ``1 / world_size``, then a sum), which `tests` check bit for bit against DDP
without a hook. The flags are small integers (0, 1 or 2 per rank), exact in every floating dtype.

Rules, so every rank reads the same flags at the same boundary:

- The agreement *stages* this rank's flags at a boundary; the first bucket of the next backward
  (bucket 0, which DDP caps at 1 MiB) takes them (zeros when nothing is staged: every rank always
  sends the same size). When it is also the last bucket (a small model) the hook waits for the
  all-reduce on the autograd thread, which saves a Python callback on the transport's thread.
- Cost: DDP runs a Python hook for every bucket (~50–80 µs each on the project's 2-core machine,
  as torch's own ``allreduce_hook``); one bucket costs ~30 µs over the built-in reducer. For a
  model of many buckets, raise ``bucket_cap_mb`` if that matters.
- Whether a step ran DDP's all-reduce is the same on every rank (DDP itself needs that), so
  every rank sees "the channel carried something this step" alike. A step without it (eval,
  ``no_sync()`` accumulation) leaves the staged flags unsent; the agreement then sends them in
  its own collective — slower, same decisions.
- DDP accepts one communication hook per model. The channel is registered once per DDP model,
  at the first session, and rebound by later sessions. When the model already has a hook of its
  own (PowerSGD, fp16 compression…), no channel is installed and the agreement uses its own
  collective; register your hook *before* the session starts (afterwards DDP refuses it).
"""
from __future__ import annotations

import logging
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

__all__ = ["GradientChannel", "attach"]

logger = logging.getLogger(__name__)

_ATTRIBUTE = "_supervisor_gradient_channel"


class GradientChannel:
    """Carries a flags tensor in a DDP model's first gradient bucket; see the module docstring."""

    def __init__(self, ddp: Any, flags_size: int) -> None:
        import torch.distributed as dist

        group = ddp.process_group if ddp.process_group is not None else dist.group.WORLD
        self._scale = 1.0 / dist.get_world_size(group)
        # The process group's own call (SUM): the per-bucket path skips the Python wrapper's checks.
        self._group = dist.distributed_c10d._get_default_group() if group is dist.group.WORLD else group
        self._options = dist.AllreduceOptions()
        self._options.reduceOp = dist.ReduceOp.SUM
        self.flags_size = flags_size
        self._outgoing: torch.Tensor | None = None
        self._received: list[list[float] | torch.Tensor] = []
        self._combined: tuple | None = None
        self._tail_zero = False  # whether the reused buffer's flags part holds zeros
        self._on_cpu = True  # where the reused buffer lives
        self.bound = False
        self.carried = 0  # backward passes that carried flags (for tests and benchmarks)

    # ------------------------------------------------------------ the agreement's side
    def bind(self) -> None:
        self._outgoing = None
        self._received = []
        self.bound = True

    def unbind(self) -> None:
        self.bound = False
        self._outgoing = None
        self._received = []

    def stage(self, flags: torch.Tensor | None) -> None:
        """Flags for the next backward (None: zeros). They replace any still unsent."""
        self._outgoing = flags

    def unsent(self) -> torch.Tensor | None:
        """Takes back the staged flags no backward has sent (a step without DDP's all-reduce)."""
        flags, self._outgoing = self._outgoing, None
        return flags

    def take(self) -> list[float] | None:
        """The flags every rank sent since the last call, summed; None when no backward ran."""
        if not self._received:
            return None
        received = [r.tolist() if isinstance(r, torch.Tensor) else r for r in self._received]
        self._received = []
        return received[0] if len(received) == 1 else [sum(column) for column in zip(*received)]

    # ------------------------------------------------------------ DDP's side
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]  # DDP checks string annotations
        """The communication hook: DDP's averaging all-reduce, plus the flags in bucket 0."""
        buffer = bucket.buffer()
        if bucket.index() != 0:
            buffer.mul_(self._scale)  # as DDP's built-in reducer: multiply, then sum
            return self._group.allreduce([buffer], self._options).get_future().then(_first)
        flags = self._outgoing
        self._outgoing = None
        combined, head, tail = self._combined_for(buffer)
        torch.mul(buffer, self._scale, out=head)  # the same multiplication, into the combined buffer
        if flags is None or not self.bound:
            if not self._tail_zero:  # the last sum left zeros there unless someone sent a flag
                tail.zero_()
        else:
            tail.copy_(flags)
        work = self._group.allreduce([combined], self._options)
        if bucket.is_last():
            # One bucket (a small model): backward has nothing left to overlap with, so wait on
            # this thread — no Python callback on the transport's thread, no GIL hand-over.
            work.wait()
            future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            future.set_result(self._split(head, tail))
            return future
        return work.get_future().then(lambda done: self._split(head, tail))

    def _combined_for(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A reused ``[bucket 0 | flags]`` buffer (reallocated when DDP rebuilds its buckets).
        Reuse is safe: DDP copies a step's result out before the next backward starts."""
        key = (buffer.numel(), buffer.dtype)  # a DDP model's buckets do not change device
        if self._combined is None or self._combined[0] != key:
            combined = torch.empty(key[0] + self.flags_size, dtype=buffer.dtype, device=buffer.device)
            self._combined = (key, combined, combined[:key[0]], combined[key[0]:])
            self._tail_zero = False
            self._on_cpu = combined.device.type == "cpu"
        return self._combined[1], self._combined[2], self._combined[3]

    def _split(self, head: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
        # Taken now: the buffer is reused by the next backward. On the CPU as a list (cheaper,
        # and it tells whether the tail is still zero); on a GPU as a copy, read at the boundary,
        # so DDP's callback never waits for the device.
        if self._on_cpu:
            values: list[float] | torch.Tensor = tail.tolist()
            self._tail_zero = not any(values)
        else:
            values, self._tail_zero = tail.clone(), False
        if self.bound:
            self._received.append(values)
            self.carried += 1
        return head


def _first(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return done.value()[0]


def attach(modules: Any, flags_size: int) -> GradientChannel | None:
    """The channel of the first DDP model among ``modules``, installed on first use.

    None when there is no DDP model, or when it already has a communication hook of its own.
    """
    for module in modules:
        if not isinstance(module, DistributedDataParallel):
            continue
        channel = getattr(module, _ATTRIBUTE, None)
        if channel is not None and channel.flags_size == flags_size:
            return channel
        if getattr(module, "_comm_hooks", None) or channel is not None:
            logger.info("the DDP model has a communication hook of its own: the rank agreement "
                        "uses a collective of its own each step (slower; same decisions)")
            return None
        channel = GradientChannel(module, flags_size)
        try:
            module.register_comm_hook(None, channel.hook)
        except (RuntimeError, ValueError) as e:  # a built-in hook (register_builtin_comm_hook) is already there
            logger.info("cannot add the rank agreement to DDP's all-reduce (%s): it uses a "
                        "collective of its own each step", e)
            return None
        setattr(module, _ATTRIBUTE, channel)
        return channel
    return None
