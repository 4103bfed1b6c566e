"""The checkpoint engine against ``torch.distributed.checkpoint`` and ``torch.save`` (SPEC §14).

One process, no process group (DCP then saves and loads as a single rank), the same state dict
(``{"model": model.state_dict()}``, what the engine saves for a model-only `TrainingState`; DCP's
and torch.save's timed windows build it, as a user's call does — ours builds it inside), the
same disk, interleaved round by round so a shared machine's drift hits every side alike. Per
round, in this order (``os.sync()`` before each write, page cache warm for every read):

- ours, **stall**: ``CheckpointManager.save`` of a periodic async save (its staging buffers were
  allocated by a warm-up save); then ``wait()`` for its commit, untimed;
- ours, **save to commit**: ``save(step, state, wait=True)`` (capture, serialisation, CRC-32,
  fsyncs, manifest, rename, index);
- DCP ``async_save`` **stall** (until it returns; its default stager is created per call, as a
  user gets it), then its future is waited for, untimed;
- DCP ``save`` + an explicit fsync of every written file and of the directory;
- ``torch.save`` + fsync (reference);
- ours, **verified restore**: a fresh ``CheckpointManager(verify="full")``, ``open()`` (reads the
  index) and ``restore(state)`` into the live model (sizes + checksums verified);
- DCP ``load`` into the same state dict (in place; verifies nothing);
- ``torch.load(weights_only=True)`` (reference).

Reported: median with min–max over the rounds (not best-of), and the ratio of medians with the
§14 target (stall ≤ 0.5× DCP ``async_save``; save-to-commit ≤ 1.0× DCP ``save`` + fsync; verified
restore ≤ 1.5× DCP ``load``).
"""
from __future__ import annotations

import gc
import os
import shutil
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from benchmarks._ranks import spread
from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager

MiB, GiB = 1 << 20, 1 << 30
_ROW_BYTES = 4096 * 4


@dataclass(frozen=True)
class Shape:
    """A state to measure: ``count`` float32 tensors of ``tensor_bytes`` each."""

    label: str
    count: int
    tensor_bytes: int

    def build(self) -> nn.Module:
        module = nn.Module()
        numel = self.tensor_bytes // 4
        if self.tensor_bytes >= MiB:  # a stack of large 4096-wide layers
            shape: tuple[int, ...] = (max(1, numel // 4096), 4096)
        else:
            shape = (numel,)
        module.weights = nn.ParameterList(nn.Parameter(torch.empty(shape).uniform_(-1, 1))
                                          for _ in range(self.count))
        return module


def parse_sizes(text: str) -> list[Shape]:
    """``"64M,256M,1G,many"`` -> shapes. ``NM``/``NG``: 8 tensors totalling N MiB/GiB;
    ``many``: 2,000 tensors of 64 KiB; ``manyK`` (e.g. ``many200``): K tensors of 64 KiB."""
    shapes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item.startswith("many"):
            count = int(item[4:] or 2000)
            shapes.append(Shape(f"{count} x 64 KiB", count, 64 * 1024))
            continue
        unit = {"M": MiB, "G": GiB}.get(item[-1:].upper())
        if unit is None:
            raise ValueError(f"--sizes: {item!r} is not NM, NG or many[K] (e.g. 64M,1G,many)")
        total = int(float(item[:-1]) * unit)
        shapes.append(Shape(f"{item[:-1]} {'MiB' if unit == MiB else 'GiB'}", 8, total // 8))
    return shapes


def _fsync_tree(path: str) -> None:
    for name in os.listdir(path):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _synced(fn: Callable[[], object]) -> float:
    os.sync()  # no writeback of earlier files in a measured window
    return _timed(fn)


def _torch_save_fsync(obj: object, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


class _Round:
    """The eight figures of one round for one shape."""

    def __init__(self, directory: str, state: TrainingState, manager: CheckpointManager) -> None:
        self.directory, self.state, self.manager = directory, state, manager
        self.dcp_dir, self.plain = os.path.join(directory, "dcp"), os.path.join(directory, "plain.pt")

    def run(self, step: int, figures: dict[str, list[float]]) -> None:
        manager, state = self.manager, self.state
        self._drop_older()
        figures["ours: async save() stall"].append(_synced(lambda: manager.save(2 * step, state)))
        manager.wait()
        self._drop_older()
        figures["ours: save to commit"].append(_synced(lambda: manager.save(2 * step + 1, state, wait=True)))
        async_dir = self.dcp_dir + "-async"
        os.sync()
        gc.collect()
        start = time.perf_counter()
        future = dcp.async_save(self._user_sd(), checkpoint_id=async_dir)
        figures["DCP async_save stall"].append(time.perf_counter() - start)
        future.result()
        shutil.rmtree(async_dir)
        figures["DCP save + fsync"].append(_synced(self._dcp_save))
        figures["torch.save + fsync"].append(_synced(lambda: _torch_save_fsync(self._user_sd(), self.plain)))
        restore_dir = self._copy_newest(2 * step + 1)
        figures["ours: verified restore"].append(_timed(lambda: self._restore(restore_dir)))
        figures["DCP load"].append(_timed(lambda: dcp.load(self._user_sd(), checkpoint_id=self.dcp_dir)))
        figures["torch.load"].append(_timed(lambda: torch.load(self.plain, weights_only=True)))
        shutil.rmtree(self.dcp_dir)
        os.remove(self.plain)

    def _user_sd(self) -> dict:
        """What a DCP user passes: ``{"model": model.state_dict()}``, built in the timed window
        as their call builds it (ours builds the same inside ``save``/``restore``). Its tensors
        share storage with the parameters, so ``dcp.load`` into it loads the live model."""
        return {"model": self.state.state_dict()["model"]}

    def _drop_older(self) -> None:
        """Deletes all but the engine's newest checkpoint (untimed; ``max_to_keep=None``), so
        retention never runs inside a measured window."""
        prefix = f"{self.manager.basename}-"
        steps = sorted(int(name[len(prefix):]) for name in os.listdir(self.manager.directory)
                       if name.startswith(prefix) and name[len(prefix):].isdigit())
        for step in steps[:-1]:
            shutil.rmtree(os.path.join(self.manager.directory, f"{prefix}{step}"))

    def _dcp_save(self) -> None:
        dcp.save(self._user_sd(), checkpoint_id=self.dcp_dir)
        _fsync_tree(self.dcp_dir)

    def _copy_newest(self, step: int) -> str:
        """Copies the engine's newest checkpoint and index to a directory no writer holds (a
        fresh manager's ``open()`` takes the logdir's lock), then syncs; untimed. The copy is in
        the page cache, as DCP's and torch.save's just-written files are."""
        restore_dir = os.path.join(self.directory, "restore")
        shutil.rmtree(restore_dir, ignore_errors=True)
        os.makedirs(restore_dir)
        newest = f"{self.manager.basename}-{step}"
        shutil.copytree(os.path.join(self.manager.directory, newest), os.path.join(restore_dir, newest))
        shutil.copy2(os.path.join(self.manager.directory, "checkpoint"), restore_dir)
        os.sync()
        return restore_dir

    def _restore(self, restore_dir: str) -> None:
        fresh = CheckpointManager(restore_dir, max_to_keep=None, verify="full")
        fresh.open()
        try:
            if fresh.restore(self.state) is None:
                raise RuntimeError("the engine found no checkpoint to restore")
        finally:
            fresh.close()


def measure_shape(directory: str, shape: Shape, rounds: int) -> tuple[int, dict[str, list[float]]]:
    """The state's byte count and all eight figures of ``shape`` over ``rounds`` interleaved rounds."""
    module = shape.build()
    nbytes = sum(p.numel() * p.element_size() for p in module.parameters())
    state = TrainingState.from_arguments(model=module)
    figures: dict[str, list[float]] = {}
    for name in ("ours: async save() stall", "ours: save to commit", "DCP async_save stall",
                 "DCP save + fsync", "torch.save + fsync", "ours: verified restore", "DCP load",
                 "torch.load"):
        figures[name] = []
    os.makedirs(directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with CheckpointManager(os.path.join(directory, "ours"), max_to_keep=None) as manager:
            # A periodic (async) save allocates the staging buffers, as a run's first one does; a
            # waited-for save would not (it writes the live CPU tensors, without a copy).
            manager.save(0, state)
            manager.wait()
            one_round = _Round(directory, state, manager)
            for step in range(1, rounds + 1):
                one_round.run(step, figures)
    shutil.rmtree(directory)
    return nbytes, figures


COMPARISONS = (  # (row, ours, DCP, target ratio)
    ("vs DCP: stall", "ours: async save() stall", "DCP async_save stall", 0.5),
    ("vs DCP: save-to-commit", "ours: save to commit", "DCP save + fsync", 1.0),
    ("vs DCP: verified restore", "ours: verified restore", "DCP load", 1.5),
)


@dataclass(frozen=True)
class Comparison:
    """One §14 ratio: medians of ours and DCP's (seconds), ratio of medians, target."""

    name: str
    ours: float
    theirs: float
    ratio: float
    target: float


def report(shape: Shape, nbytes: int, figures: dict[str, list[float]]) -> list[Comparison]:
    """Prints every figure with its spread and the three §14 ratios of one shape."""
    print(f"  {shape.label} ({shape.count} tensors, {nbytes / MiB:.0f} MiB), {len(next(iter(figures.values())))} "
          "rounds, seconds as median (min-max):")
    for name, values in figures.items():
        print(f"    {name:<28s} {spread(values)}")
    results = []
    for row, ours, theirs, target in COMPARISONS:
        mine, dcps = statistics.median(figures[ours]), statistics.median(figures[theirs])
        results.append(Comparison(f"{row} @ {shape.label}", mine, dcps, mine / dcps, target))
    return results


def run_dcp_comparison(directory: str, shapes: list[Shape], rounds: int) -> list[Comparison]:
    """Measures and prints every shape; returns every (row, ratio, ok)."""
    print(f"\nvs torch.distributed.checkpoint (one process, no process group) and torch.save, "
          f"{rounds} interleaved rounds per shape:")
    results = []
    for index, shape in enumerate(shapes):
        nbytes, figures = measure_shape(os.path.join(directory, f"dcp-shape-{index}"), shape, rounds)
        results.extend(report(shape, nbytes, figures))
    return results
