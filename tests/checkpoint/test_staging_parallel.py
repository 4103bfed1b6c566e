"""Capture of a many-tensor state: one dispatch per thread, two threads, exact copies."""
from __future__ import annotations

import threading

import torch

from supervisor.checkpoint.save import staging
from supervisor.checkpoint.save.staging import StagingArea


def _many_tensor_state():
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(240):  # 240 × 64 KiB = 15 MiB: over the parallel threshold
        kind = i % 4
        if kind == 0:
            tensors[f"w{i}"] = torch.randn(128, 128, generator=g)
        elif kind == 1:
            tensors[f"t{i}"] = torch.randn(128, 128, generator=g).t()  # not contiguous
        elif kind == 2:
            tensors[f"d{i}"] = torch.randn(64, 128, generator=g, dtype=torch.float64)
        else:
            tensors[f"i{i}"] = torch.randint(0, 1000, (64, 128), generator=g)
    tensors["tied"] = tensors["w0"]
    return {"model": tensors}


def test_a_many_tensor_capture_is_copied_by_two_threads_exactly(monkeypatch):
    threads_seen = []
    real_start = threading.Thread.start

    def start(self):
        threads_seen.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        state = _many_tensor_state()
        area = StagingArea()
        first = area.capture(state)
        pointers = {k: v.data_ptr() for k, v in first["model"].items()}
        for tensor in state["model"].values():
            tensor.add_(1)  # training goes on: a new capture must see it, the old buffers reused
        second = area.capture(state)
    finally:
        torch.set_num_threads(before)
    assert "supervisor-capture" in threads_seen
    for name, tensor in state["model"].items():
        assert torch.equal(second["model"][name], tensor), name
        assert second["model"][name].data_ptr() == pointers[name]  # steady state: no allocation
    assert second["model"]["tied"] is second["model"]["w0"]  # one buffer for two names
    assert area.nbytes == sum(t.numel() * t.element_size() for n, t in state["model"].items() if n != "tied")


def test_an_error_in_the_second_thread_reaches_the_caller(monkeypatch):
    calls = []
    real = torch._foreach_copy_

    def failing(dst, src, **kwargs):
        calls.append(threading.current_thread().name)
        if threading.current_thread().name == "supervisor-capture":
            raise RuntimeError("copy failed in the helper thread")
        return real(dst, src, **kwargs)

    monkeypatch.setattr(torch, "_foreach_copy_", failing)
    src = [torch.randn(128, 128) for _ in range(200)]
    dst = [torch.empty_like(t) for t in src]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        try:
            staging._copy_cpu(dst, src)
        except RuntimeError as e:
            assert "helper thread" in str(e)
        else:
            raise AssertionError("the helper thread's error was lost")
    finally:
        torch.set_num_threads(before)
    assert sorted(calls) == ["MainThread", "supervisor-capture"]
