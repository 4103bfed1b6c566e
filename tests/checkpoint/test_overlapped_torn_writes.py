"""Overlapped capture never commits a torn checkpoint, whatever in-place write lands between the
boundary and ``optimizer.step()`` (SPEC §5.9, issue 30 item 1).

Each kind of write runs the same seeded loop twice: with ``capture="blocking"`` and with
``capture="overlapped"`` through a `ThreadCopier` whose copy the test drives by handshakes, so
the write lands, per save (a seeded choice), *before* the copy starts, *in the middle* of it
(the first half of every tensor copied, the second half after the write: a torn copy), or
*after* it finished. Every checkpoint the overlapped run commits must equal the blocking run's
checkpoint of that step tensor by tensor (bit for bit); every other save must have been
discarded with a WARNING. A write that changes nothing commits.
"""
from __future__ import annotations

import logging
import random
import threading
from typing import Callable

import pytest
import torch

from supervisor import TrainingState, load_checkpoint
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.save.overlap import ThreadCopier

pytestmark = pytest.mark.timeout(300)

_WAIT = 30  # seconds any handshake may take before the test fails (never reached when it works)


class DrivenCopy:
    """A `ThreadCopier` copy that the training thread drives: ``position`` (set before each save)
    says whether the step's write lands before the copy, in its middle, or after it."""

    def __init__(self) -> None:
        self.position = "after"
        self.half, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.copier = ThreadCopier(self._copy)

    def arm(self, position: str) -> None:
        self.position = position
        for event in (self.half, self.go, self.done):
            event.clear()

    def _copy(self, dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        position = self.position
        if position == "before":
            assert self.go.wait(_WAIT), "the step never wrote"
        cuts = [s.numel() // 2 for s in src]
        for d, s, cut in zip(dst, src, cuts):  # the first half of every tensor
            d.view(-1)[:cut].copy_(s.reshape(-1)[:cut])
        if position == "mid":
            self.half.set()
            assert self.go.wait(_WAIT), "the step never wrote"
        for d, s, cut in zip(dst, src, cuts):  # the rest, after the write when "mid"
            d.view(-1)[cut:].copy_(s.reshape(-1)[cut:])
        self.done.set()

    def before_write(self) -> None:
        """On the training thread, just before the step's write."""
        if self.position == "after":
            assert self.done.wait(_WAIT), "the copy never finished"
        elif self.position == "mid":
            assert self.half.wait(_WAIT), "the copy never reached its middle"

    def after_write(self) -> None:
        self.go.set()


def _abs(model, optimizer, n):
    model[0].weight.data.abs_()  # a positivity constraint


def _neg(model, optimizer, n):
    model[0].weight.data.neg_()  # an even number of sign flips cancels in a bit-sum


def _roll(model, optimizer, n):
    p = model[0].weight
    p.data.copy_(p.data.roll(1))  # a permutation


def _sign_flip_no_grad(model, optimizer, n):
    with torch.no_grad():
        model[2].weight.mul_(-1)


def _single_element(model, optimizer, n):
    model[0].weight.data[n % 8, n % 5] += 1.0


def _view_write(model, optimizer, n):
    model[0].weight.detach()[3:5].mul_(0.5)  # through a view (rows 3 and 4)


def _swap_rows(model, optimizer, n):
    w = model[0].weight.data
    w[[0, 1]] = w[[1, 0]]


def _no_grad_copy(model, optimizer, n):
    with torch.no_grad():
        model[0].bias.copy_(model[0].bias.flip(0))


def _clamp(model, optimizer, n):
    model[2].weight.data.clamp_(-0.05, 0.05)


def _no_op_clamp(model, optimizer, n):
    model[2].weight.data.clamp_(-1e9, 1e9)  # written, but no bit changes: commits


def _optimizer_state(model, optimizer, n):
    if n > 1:  # Adam's moments exist after the first step
        optimizer.state[model[0].weight]["exp_avg"].neg_()


def _double_neg(model, optimizer, n):
    w = model[2].weight.data  # back to where it was: the copy is not torn, whenever it ran
    w.neg_()
    w.neg_()


def _alias_write(model, optimizer, n):
    alias = model.__dict__.setdefault("alias", model[0].weight.data.view(-1))  # kept from the first step
    alias[::2].neg_()  # every other value flips its sign


WRITES: dict[str, Callable] = {
    "p.data.abs_": _abs, "p.data.neg_": _neg, "p.data.copy_(roll)": _roll, "no_grad mul_(-1)": _sign_flip_no_grad,
    "single element": _single_element, "view write": _view_write, "swap two rows": _swap_rows,
    "no_grad copy_(flip)": _no_grad_copy, "p.data.clamp_": _clamp, "no-op clamp_": _no_op_clamp,
    "optimizer state neg_": _optimizer_state, "neg_ twice": _double_neg, "alias write": _alias_write,
}
STEPS = 24
POSITIONS = ("after",) * 5 + ("mid", "mid", "before")  # mostly after: those saves may commit


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    return TrainingState.from_arguments(model=model, optimizer=optimizer)


def _run(directory, write: Callable, *, driven: DrivenCopy | None, positions: list[str]) -> None:
    state = _state()
    model, optimizer = state["model"], state["optimizer"]
    capture = "blocking" if driven is None else "overlapped"
    kwargs = {} if driven is None else {"copier": driven.copier}
    with CheckpointManager(directory, capture=capture, max_to_keep=None, **kwargs) as manager:
        for n in range(1, STEPS + 1):
            optimizer.zero_grad()
            x = torch.randn(16, 10, generator=torch.Generator().manual_seed(n))
            model(x).pow(2).mean().backward()
            if driven is not None and n > 1:
                driven.before_write()
            write(model, optimizer, n)
            if driven is not None and n > 1:
                driven.after_write()
            optimizer.step()
            if driven is not None:
                driven.arm(positions[n - 1])
            manager.save(n, state)
        if driven is not None:  # the last save's copy has no step after it
            driven.before_write()
            driven.after_write()


def _tensors(tree, prefix=""):
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{prefix}[{i}]")


def _equal(actual: dict, expected: dict) -> list[str]:
    """The names of the tensors that differ bit for bit (or are missing)."""
    want = dict(_tensors({k: expected[k] for k in ("model", "optimizer")}))
    got = dict(_tensors({k: actual[k] for k in ("model", "optimizer")}))
    return [name for name, e in want.items() if name not in got or got[name].dtype != e.dtype
            or not torch.equal(got[name].view(-1).view(torch.uint8) if e.dim() else got[name],
                               e.view(-1).view(torch.uint8) if e.dim() else e)]


def _check(tmp_path, kind: str, caplog) -> tuple[int, int]:
    """(committed, discarded) of one kind of write; asserts none is torn."""
    write = WRITES[kind]
    rng = random.Random(kind)
    positions = [rng.choice(POSITIONS) for _ in range(STEPS)]
    _run(tmp_path / "blocking", write, driven=None, positions=positions)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint"):
        _run(tmp_path / "overlapped", write, driven=DrivenCopy(), positions=positions)
    warned = {int(m.split("discarding the checkpoint of step ")[1].split()[0])
              for m in (r.getMessage() for r in caplog.records) if "discarding the checkpoint of step" in m}
    committed, torn = 0, []
    for n in range(1, STEPS + 1):
        path = tmp_path / "overlapped" / f"model.ckpt-{n}"
        if not path.exists():
            assert n in warned, f"{kind}: the save of step {n} ({positions[n - 1]}) vanished without a WARNING"
            # A write after the copy finished cannot have torn it: such a save commits.
            assert positions[n - 1] != "after", f"{kind}: step {n} discarded, its write came after the copy"
            continue
        assert n not in warned, f"{kind}: step {n} was both committed and discarded"
        differing = _equal(load_checkpoint(str(path)), load_checkpoint(str(tmp_path / "blocking" / f"model.ckpt-{n}")))
        if differing:
            torn.append(f"step {n} (write {positions[n - 1]} the copy): {differing}")
        committed += 1
    assert not torn, f"{kind}: {len(torn)} torn checkpoint(s) committed without a WARNING: {torn}"
    return committed, len(warned)


TOTALS: dict[str, tuple[int, int]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(WRITES))
def test_no_in_place_write_commits_a_torn_checkpoint(tmp_path, caplog, kind):
    committed, discarded = _check(tmp_path, kind, caplog)
    TOTALS[kind] = committed, discarded
    if kind in ("no-op clamp_", "neg_ twice"):  # nothing a checkpoint holds changed: every save commits
        assert committed == STEPS, (kind, committed, discarded)


@pytest.mark.slow
def test_the_matrix_committed_at_least_200_overlapped_checkpoints():
    """Runs after the matrix (same module, in order): its totals, as the issue asks."""
    if len(TOTALS) != len(WRITES):
        pytest.skip("the matrix did not run in full in this session")
    committed = sum(c for c, _ in TOTALS.values())
    discarded = sum(d for _, d in TOTALS.values())
    print(f"torn-write matrix: {len(WRITES)} kinds, {committed} committed (0 torn), {discarded} discarded "
          f"with a WARNING: {TOTALS}")
    assert committed >= 200
