"""Overlapped capture (SPEC §5.9): the checkpoint is the cut after step N while step N+1 runs.

Each test runs twice: with a side thread standing in for the side stream (a copy the test holds
back with an event), and with a real CUDA side stream (a copy held back by a device sleep queued
before it), skipped where there is no CUDA device.
"""
from __future__ import annotations

import logging
import threading

import pytest
import torch

from supervisor import TrainingState, load_checkpoint
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.save.overlap import Copier, StreamCopier, ThreadCopier

pytestmark = pytest.mark.timeout(60)

_NO_CUDA = "no CUDA device: the real-stream variant needs torch.cuda.is_available()"


class Gate:
    """A copier whose copies wait until `open`: a side thread on CPU, a device sleep on CUDA."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.device = "cuda" if backend == "cuda" else "cpu"
        self._event = threading.Event()
        if backend == "cuda":
            self.copier: Copier = StreamCopier(before_copy=lambda: torch.cuda._sleep(200_000_000))
        else:
            self.copier = ThreadCopier(self._copy)

    def _copy(self, dst: list, src: list) -> None:
        assert self._event.wait(30), "the test never opened the gate"
        torch._foreach_copy_(dst, src)

    @property
    def host_blocks(self) -> bool:
        """Whether a waiting optimizer step blocks the host thread (the side thread) or only
        queues behind the copy on the device (a stream)."""
        return self.backend == "thread"

    def open(self) -> None:
        self._event.set()

    def close(self) -> None:
        self._event.clear()


@pytest.fixture(params=["thread", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason=_NO_CUDA))])
def gate(request):
    g = Gate(request.param)
    yield g
    g.open()  # never leave a copy thread waiting


def make_state(device: str, *, seed: int = 0, extra: dict | None = None) -> TrainingState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    return TrainingState.from_arguments(model=model, optimizer=optimizer, state=extra)


def forward_backward(state: TrainingState, seed: int) -> None:
    model = state["model"]
    device = next(model.parameters()).device
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed)).to(device)
    for name, obj in state.items():
        if isinstance(obj, torch.optim.Optimizer):
            obj.zero_grad()
    model(x).pow(2).mean().backward()


def full_step(state: TrainingState, seed: int) -> None:
    forward_backward(state, seed)
    state["optimizer"].step()


def cpu_clone(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: cpu_clone(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(cpu_clone(v) for v in tree)
    return tree


def assert_bit_equal(actual, expected, where="") -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert torch.equal(actual.cpu().view(torch.uint8), expected.cpu().contiguous().view(torch.uint8)) if \
            expected.dim() else torch.equal(actual.cpu(), expected.cpu()), where
    elif isinstance(expected, dict):
        assert set(actual) == set(expected), where
        for k in expected:
            assert_bit_equal(actual[k], expected[k], f"{where}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_bit_equal(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


def manager_for(tmp_path, gate: Gate, **kwargs) -> CheckpointManager:
    manager = CheckpointManager(tmp_path / "ckpt", capture="overlapped", copier=gate.copier, **kwargs)
    manager.open()
    return manager


def test_the_checkpoint_is_step_n_bit_for_bit_while_step_n_plus_1_runs(tmp_path, gate):
    state = make_state(gate.device)
    full_step(state, 0)
    full_step(state, 1)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(2, state)
        forward_backward(state, 2)  # step 3's forward and backward run while the copy waits
        stepper = threading.Thread(target=state["optimizer"].step)
        stepper.start()
        stepper.join(0.3)
        if gate.host_blocks:
            assert stepper.is_alive(), "optimizer.step() did not wait for the copy"
            for name, p in state["model"].named_parameters():  # not state_dict(): that waits too
                assert torch.equal(p.detach().cpu(), expected["model"][name]), f"{name} written during the copy"
        gate.open()
        stepper.join(10)
        assert not stepper.is_alive()
        manager.wait()
    finally:
        manager.close()
    assert not torch.equal(state["model"][0].weight.cpu(), expected["model"]["0.weight"])  # step 3 ran
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-2"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


def test_buffers_are_captured_at_the_boundary_not_later(tmp_path, gate):
    state = make_state(gate.device)
    full_step(state, 0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        forward_backward(state, 1)  # BatchNorm's running statistics change in this forward
        assert not torch.equal(state["model"][1].running_mean.cpu(), expected["model"]["1.running_mean"])
        gate.open()
        state["optimizer"].step()
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal(saved["model"], expected["model"])
    assert_bit_equal(saved["optimizer"], expected["optimizer"])


@pytest.mark.parametrize("write", ["p.data", "no_grad in place", "detached view"])
def test_a_write_during_the_copy_discards_the_save_with_a_warning(tmp_path, gate, caplog, write):
    state = make_state(gate.device)
    full_step(state, 0)
    manager = manager_for(tmp_path, gate, max_to_keep=None)
    weight = state["model"][2].weight
    try:
        manager.save(1, state)
        with torch.no_grad():
            if write == "p.data":
                weight.data.clamp_(-1e-3, 1e-3)  # a fresh version counter: the fingerprint sees it
            elif write == "no_grad in place":
                weight.mul_(0.5)
            else:
                weight.detach().add_(1.0)
        gate.open()
        with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint.manager"):
            full_step(state, 1)
            manager.wait()
        assert not (tmp_path / "ckpt" / "model.ckpt-1").exists()
        assert manager.last_saved_step is None
        [record] = [r for r in caplog.records if "discarding the checkpoint of step 1" in r.getMessage()]
        assert record.levelno == logging.WARNING
        assert "model.2.weight" in record.getMessage() and "capture='blocking'" in record.getMessage()
        # Training goes on and the next save commits.
        expected = cpu_clone(state.state_dict())
        manager.save(2, state)
        full_step(state, 2)
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-2"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


def test_close_waits_for_the_copy_and_resume_is_bit_exact(tmp_path, gate):
    state = make_state(gate.device)
    for i in range(3):
        full_step(state, i)
    manager = manager_for(tmp_path, gate)
    manager.save(3, state)
    forward_backward(state, 99)  # a step that never reaches its optimizer step: the run ends
    closer = threading.Thread(target=manager.close)
    closer.start()
    closer.join(0.3)
    if gate.host_blocks:
        assert closer.is_alive(), "close() did not wait for the copy"
    gate.open()
    closer.join(10)
    assert not closer.is_alive()
    uninterrupted = make_state(gate.device)
    for i in range(6):
        full_step(uninterrupted, i)
    resumed = make_state(gate.device, seed=1)
    with CheckpointManager(tmp_path / "ckpt") as reader:
        assert reader.restore(resumed).global_step == 3
    for i in range(3, 6):
        full_step(resumed, i)
    assert_bit_equal(cpu_clone(resumed.state_dict()), cpu_clone(uninterrupted.state_dict()))


def test_gradient_accumulation_waits_at_the_optimizer_step_not_the_next_micro_step(tmp_path, gate):
    state = make_state(gate.device)
    full_step(state, 0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        state["optimizer"].zero_grad()
        for micro in range(3):  # three micro-steps accumulate gradients while the copy waits
            model = state["model"]
            x = torch.randn(8, 6, generator=torch.Generator().manual_seed(micro)).to(gate.device)
            model(x).pow(2).mean().backward()
        assert not (tmp_path / "ckpt" / "model.ckpt-1").exists()
        gate.open()
        state["optimizer"].step()
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


def test_every_optimizer_of_the_state_waits(tmp_path, gate):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)).to(gate.device)
    first = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
    second = torch.optim.Adam(model[1].parameters(), lr=0.1)
    state = TrainingState({"model": model, "first": first, "second": second})

    def step_both(seed):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(seed)).to(gate.device)
        first.zero_grad()
        second.zero_grad()
        model(x).sum().backward()
        first.step()
        second.step()

    step_both(0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)).to(gate.device)
        model(x).sum().backward()
        stepper = threading.Thread(target=second.step)  # the second optimizer alone
        stepper.start()
        stepper.join(0.3)
        if gate.host_blocks:
            assert stepper.is_alive(), "the second optimizer's step did not wait for the copy"
        gate.open()
        stepper.join(10)
        first.step()
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


def test_a_grad_scaler_step_waits_for_the_copy(tmp_path, gate):
    scaler = torch.amp.GradScaler(gate.device, init_scale=2.0**8)
    state = make_state(gate.device, extra={"scaler": scaler})
    model, optimizer = state["model"], state["optimizer"]

    def scaled_step(seed, *, step=True):
        optimizer.zero_grad()
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed)).to(gate.device)
        scaler.scale(model(x).pow(2).mean()).backward()
        if step:
            scaler.step(optimizer)
            scaler.update()

    scaled_step(0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        scaled_step(1, step=False)
        stepper = threading.Thread(target=scaler.step, args=(optimizer,))
        stepper.start()
        stepper.join(0.3)
        if gate.host_blocks:
            assert stepper.is_alive(), "GradScaler.step did not wait for the copy"
        gate.open()
        stepper.join(10)
        scaler.update()
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


@pytest.mark.slow  # dynamo's first compile: seconds
def test_a_compiled_model_and_optimizer_step_are_captured_exactly(tmp_path, gate):
    state = make_state(gate.device)
    compiled = torch.compile(state["model"], backend="eager")
    state = TrainingState({"model": compiled, "optimizer": state["optimizer"]})
    optimizer = state["optimizer"]

    @torch.compile(backend="eager")
    def optimizer_step():
        optimizer.step()

    def step(seed, *, opt=True):
        optimizer.zero_grad()
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(seed)).to(gate.device)
        compiled(x).pow(2).mean().backward()
        if opt:
            optimizer_step()

    step(0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        step(1, opt=False)
        stepper = threading.Thread(target=optimizer_step)
        stepper.start()
        stepper.join(0.5)
        if gate.host_blocks:
            assert stepper.is_alive(), "the compiled optimizer step did not wait for the copy"
        gate.open()
        stepper.join(30)
        assert not stepper.is_alive()
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


class _NeverCopier(Copier):
    def start(self, dst, src):
        raise AssertionError("a blocking capture started a background copy")


@pytest.mark.parametrize("capture", ["auto", "blocking"])
def test_cpu_tensors_are_captured_blocking_by_default(tmp_path, capture):
    state = make_state("cpu")
    full_step(state, 0)
    expected = cpu_clone(state.state_dict())
    with CheckpointManager(tmp_path, capture=capture, copier=_NeverCopier()) as manager:
        manager.save(1, state)
        assert not state["optimizer"]._optimizer_step_pre_hooks  # nothing to wait for
        full_step(state, 1)
    saved = load_checkpoint(str(tmp_path / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)


def test_the_hooks_are_removed_once_the_copy_is_settled(tmp_path, gate):
    state = make_state(gate.device)
    full_step(state, 0)
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        assert len(state["optimizer"]._optimizer_step_pre_hooks) == 1
        gate.open()
        full_step(state, 1)
        manager.wait()
        assert not state["optimizer"]._optimizer_step_pre_hooks
    finally:
        manager.close()


@pytest.mark.parametrize("value", ["fast", "Overlapped", None, 1])
def test_a_bad_capture_value_is_refused_naming_it(tmp_path, value):
    with pytest.raises(ValueError, match=r"capture must be one of 'auto', 'overlapped', 'blocking', got"):
        CheckpointManager(tmp_path, capture=value)


def test_a_copier_must_be_a_copier(tmp_path):
    with pytest.raises(TypeError, match="copier must be"):
        CheckpointManager(tmp_path, copier=lambda dst, src: None)


def test_a_state_dict_read_on_another_thread_waits_without_settling(tmp_path, gate):
    """E.g. a summary service reading the model: it waits for the copy, and the training
    thread's optimizer step still settles (and checks) the copy itself."""
    state = make_state(gate.device)
    full_step(state, 0)
    expected = cpu_clone(state.state_dict())
    manager = manager_for(tmp_path, gate)
    try:
        manager.save(1, state)
        reader = threading.Thread(target=state["model"].state_dict)
        reader.start()
        reader.join(0.3)
        if gate.host_blocks:
            assert reader.is_alive(), "state_dict() on another thread did not wait for the copy"
        gate.open()
        reader.join(10)
        assert not reader.is_alive()
        full_step(state, 1)
        manager.wait()
    finally:
        manager.close()
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model.ckpt-1"))
    assert_bit_equal({k: saved[k] for k in expected}, expected)
