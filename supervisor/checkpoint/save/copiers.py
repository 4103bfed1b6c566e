"""The copiers of the overlapped capture (SPEC §5.9, `supervisor.checkpoint.save.overlap`): each
starts ``dst[i].copy_(src[i])`` in the background and returns a `CopyJob` that the training
thread settles (it may write the sources after) and the writer waits for (the buffers hold the
copy). `StreamCopier`: a side CUDA stream per device (CPU sources on a side thread);
`ThreadCopier`: a side thread, the stand-in on a CPU (injectable, so tests can force a slow copy).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

__all__ = ["Copier", "CopyJob", "DefaultCopier", "StreamCopier", "ThreadCopier", "check_copier"]


def check_copier(copier: Any) -> Copier:
    """``copier`` itself, or a `DefaultCopier` for None."""
    if copier is None:
        return DefaultCopier()
    if not isinstance(copier, Copier):
        raise TypeError(f"copier must be a supervisor.checkpoint.save.overlap.Copier (e.g. ThreadCopier()) or None, "
                        f"got {copier!r}")
    return copier


class CopyJob:
    """One background copy: `settle` orders the training side after it, `wait_host` the writer."""

    def settle(self) -> None:
        """On the training thread: after this returns, the sources may be written."""
        raise NotImplementedError

    def wait_host(self) -> None:
        """On any thread: blocks until the buffers hold the copy; raises the copy's error."""
        raise NotImplementedError


class Copier:
    """Starts ``dst[i].copy_(src[i])`` for all i in the background; returns its `CopyJob`."""

    def start(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> CopyJob:
        raise NotImplementedError


class _ThreadJob(CopyJob):
    def __init__(self, copy_fn: Callable[[list, list], None], dst: list, src: list) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(copy_fn, dst, src),
                                        name="supervisor-overlapped-copy", daemon=True)
        self._thread.start()

    def _run(self, copy_fn: Callable[[list, list], None], dst: list, src: list) -> None:
        try:
            with torch.no_grad():
                copy_fn(dst, src)
        except BaseException as e:  # noqa: BLE001 - reported by wait_host, on the writer's thread
            self._error = e

    def settle(self) -> None:
        self._thread.join()

    def wait_host(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


class ThreadCopier(Copier):
    """Copies on a short-lived side thread: the stand-in for a side stream on CPU tensors.

    Args:
        copy_fn: ``copy_fn(dst, src)`` does the copy (default ``torch._foreach_copy_``); a test
            passes one that waits on an event to force a slow copy.
    """

    def __init__(self, copy_fn: Callable[[list, list], None] | None = None) -> None:
        self._copy_fn = copy_fn if copy_fn is not None else torch._foreach_copy_

    def start(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> CopyJob:
        return _ThreadJob(self._copy_fn, dst, src)


class _StreamJob(CopyJob):
    def __init__(self, events: list[tuple[torch.device, Any]]) -> None:
        self._events = events

    def settle(self) -> None:
        for device, event in self._events:
            torch.cuda.current_stream(device).wait_event(event)  # no host sync

    def wait_host(self) -> None:
        for _, event in self._events:
            event.synchronize()


class StreamCopier(Copier):
    """Copies CUDA tensors into pinned buffers on a side stream per device, after the work the
    current stream has queued (the boundary); the copy waits for nothing the step enqueues later.

    Args:
        before_copy: called on the side stream before the copy (a test forces a slow copy with
            ``torch.cuda._sleep``).
    """

    def __init__(self, before_copy: Callable[[], None] | None = None) -> None:
        self._streams: dict[torch.device, Any] = {}
        self._before_copy = before_copy

    def start(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> CopyJob:
        """CUDA sources on the side streams; any others (an optimizer's CPU ``step`` counters,
        which Adam keeps on the CPU next to CUDA moments) on a side thread."""
        cuda = [i for i, s in enumerate(src) if s.device.type == "cuda"]
        other = [i for i, s in enumerate(src) if s.device.type != "cuda"]
        jobs: list[CopyJob] = []
        if cuda:
            jobs.append(self._start_streams([dst[i] for i in cuda], [src[i] for i in cuda]))
        if other:
            jobs.append(ThreadCopier().start([dst[i] for i in other], [src[i] for i in other]))
        return jobs[0] if len(jobs) == 1 else _Jobs(jobs)

    def _start_streams(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> CopyJob:
        by_device: dict[torch.device, tuple[list, list]] = {}
        for d, s in zip(dst, src):
            pair = by_device.setdefault(s.device, ([], []))
            pair[0].append(d)
            pair[1].append(s)
        events = []
        for device, (d, s) in by_device.items():
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream), torch.no_grad():
                if self._before_copy is not None:
                    self._before_copy()
                torch._foreach_copy_(d, s, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            events.append((device, event))
        return _StreamJob(events)


class DefaultCopier(StreamCopier):
    """The copier a manager uses: CUDA tensors on a side stream per device (kept), the others on
    a side thread (`StreamCopier` without a ``before_copy``)."""


class _Jobs(CopyJob):
    def __init__(self, jobs: list[CopyJob]) -> None:
        self._jobs = jobs

    def settle(self) -> None:
        for job in self._jobs:
            job.settle()

    def wait_host(self) -> None:
        for job in self._jobs:
            job.wait_host()
