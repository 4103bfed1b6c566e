"""The trainer that tests/integration/test_crash_safety.py kills with SIGKILL (SPEC §15).

A small deterministic CPU model trained under `MonitoredTrainingSession` with async
checkpoints every ``--save-steps`` steps and a stateful data iterator in the training state.
Every step draws from all three global generators (torch dropout and noise, Python
``random``, NumPy), so a resumed run only matches an uninterrupted one bit for bit when the
checkpoint restored the weights, the optimizer, the data position *and* the RNG states.

Kill seam (this script only — the library is never modified): ``CRASH_AT="point:n[,point:n]"``
makes this process SIGKILL itself at the ``n``-th time it reaches ``point`` (counted per
process; several pairs: whichever comes first). The points are reached by wrapping, inside
this process, the library functions that perform each phase of a save; the wrapper only
decides *when* the process dies, the real code still runs:

=========  ===========================================================================
step       inside the step function, after backward, before ``optimizer.step()``
capture    inside the capture, after the tensors were staged, before the RNG capture
write      halfway through writing ``state.pt`` (a torn file in the temp directory)
seal       ``state.pt`` written and fsynced, before ``MANIFEST.json`` is created
rename     the temp directory sealed, before it is renamed to ``model.ckpt-N``
publish    renamed (committed), before the index names it
index      the new index written to its temp file and fsynced, before it is put in place (``os.replace``)
replace    re-saving a step that is already committed: the old directory moved aside, the
           new one not yet renamed into place (reached with ``--save-at-start`` after a restore)
retain     the index names it; retention moved an old checkpoint aside, the index still
           lists the old one
delete     retention half-way through deleting the moved-aside checkpoint
=========  ===========================================================================

Output (stdout, unbuffered; the parent parses it): ``ready``, the library's INFO lines
(``restored step=N from PATH`` / ``initialised from scratch``, ``committed model.ckpt-N``),
``transient after open: [...]`` (leftover temp entries once the session is created),
``killing at POINT`` just before a seam fires, and ``finished step=N`` after writing the
final state (weights, optimizer, data position and one draw of each generator) to
``--out``.

    CRASH_AT=write:3 python tests/integration/crash_trainer.py LOGDIR --steps 40 --out w.pt
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"))
from quickstart import ShuffledBatches  # noqa: E402

SEAM_ENV = "CRASH_AT"
POINTS = ("step", "capture", "write", "seal", "rename", "publish", "index", "retain", "delete", "replace")


class Seam:
    """Counts how often each kill point is reached and kills the process at the chosen one."""

    def __init__(self, spec: str) -> None:
        self.targets: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            point, _, n = item.partition(":")
            if point not in POINTS or not n.isdigit() or int(n) < 1:
                raise SystemExit(f"{SEAM_ENV}: bad item {item!r}; expected point:n with point in {POINTS}")
            self.targets[point] = int(n)
        self.counts = {point: 0 for point in POINTS}

    def reached(self, point: str) -> bool:
        """Counts one visit of ``point``; True when this visit is the one to die at."""
        self.counts[point] += 1
        return self.targets.get(point) == self.counts[point]

    def maybe_die(self, point: str) -> None:
        if self.reached(point):
            die(point)


def die(point: str) -> None:
    print(f"killing at {point}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _replace(module: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Swaps ``module.name`` for ``make(original)``; fails loudly if the library moved it, so a
    refactoring can never turn a kill test into one that silently kills nothing."""
    original = getattr(module, name, None)
    if not callable(original):
        raise SystemExit(f"crash_trainer: {module.__name__}.{name} is gone; update the kill points")
    setattr(module, name, make(original))


class _TearingFile:
    """A raw file whose first write stops halfway and kills the process (a torn state.pt)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes:
            self._raw.write(view[:max(1, view.nbytes // 2)])
            self._raw.flush()
            die("write")
        return self._raw.write(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _SeamedOs:
    """The ``os`` module as one library module sees it, with the index put in place (the index
    point: ``os.replace``, or ``os.link`` for the first index) and the second ``os.rename`` of a
    temp directory (the replace point) counted."""

    def __init__(self, seam: Seam) -> None:
        self._seam = seam
        self._renamed_once: set[str] = set()

    def replace(self, src: Any, dst: Any, *a: Any, **k: Any) -> None:
        if os.path.basename(os.fspath(dst)) == "checkpoint":
            self._seam.maybe_die("index")
        os.replace(src, dst, *a, **k)

    def link(self, src: Any, dst: Any, *a: Any, **k: Any) -> None:
        if os.path.basename(os.fspath(dst)) == "checkpoint":
            self._seam.maybe_die("index")
        os.link(src, dst, *a, **k)

    def rename(self, src: Any, dst: Any, *a: Any, **k: Any) -> None:
        if ".tmp-" in os.path.basename(os.fspath(src)):
            if src in self._renamed_once:  # the first try found the name taken: a replacement
                self._seam.maybe_die("replace")
            self._renamed_once.add(src)
        os.rename(src, dst, *a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def install_seams(seam: Seam) -> None:
    """Wraps the library functions that perform each phase of a save (see the module doc)."""
    from supervisor.checkpoint.storage import local as local_storage
    from supervisor.checkpoint import manager
    from supervisor.checkpoint.save import publish

    for module in (local_storage,):
        if getattr(module, "os", None) is not os:
            raise SystemExit(f"crash_trainer: {module.__name__} no longer uses os; update the kill points")
        module.os = _SeamedOs(seam)  # type: ignore[assignment]

    def capture(original):
        def wrapped(*a, **k):
            seam.maybe_die("capture")
            return original(*a, **k)
        return wrapped

    def opener(original):
        def wrapped(path):
            if os.path.basename(path) == "MANIFEST.json":
                seam.maybe_die("seal")
            raw = original(path)
            if os.path.basename(path) == "state.pt" and seam.reached("write"):
                return _TearingFile(raw)
            return raw
        return wrapped

    def rename(original):
        def wrapped(*a, **k):
            seam.maybe_die("rename")
            result = original(*a, **k)
            seam.maybe_die("publish")
            return result
        return wrapped

    def move_aside(original):
        def wrapped(*a, **k):
            result = original(*a, **k)
            seam.maybe_die("retain")
            return result
        return wrapped

    def remove_tree(original):
        def wrapped(path, *a, **k):
            if seam.reached("delete"):
                for root, _, files in os.walk(path):
                    for name in sorted(files)[:1]:  # delete one file of the checkpoint, then die
                        os.remove(os.path.join(root, name))
                die("delete")
            return original(path, *a, **k)
        return wrapped

    _replace(manager, "capture_rng_state", capture)
    _replace(local_storage, "default_opener", opener)
    _replace(local_storage, "rename_into_place", rename)
    _replace(publish, "move_aside", move_aside)
    _replace(publish, "remove_tree", remove_tree)


def make_batches() -> ShuffledBatches:
    """An endless iterator over a fixed dataset, reshuffled per epoch; its position is part of
    the training state (``state={"data": ...}``). The quickstart's iterator, on other data."""
    g = torch.Generator().manual_seed(1234)
    return ShuffledBatches(torch.randn(96, 16, generator=g), torch.randint(0, 4, (96,), generator=g),
                           batch_size=8, seed=7)


def deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True)`` minus its 1.2 s import of torch._inductor
    (only to set inductor's own flag; nothing is compiled here) — paid by every restart."""
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:
        torch.use_deterministic_algorithms(True)
    else:
        setter(True)
    assert torch.are_deterministic_algorithms_enabled()


def seed_everything(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--steps", type=int, required=True, help="train until this global step")
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--max-to-keep", type=int, default=2)
    parser.add_argument("--step-sleep-secs", type=float, default=0.0, help="room for timed kills")
    parser.add_argument("--out", required=True, help="where the final state goes (torch.save)")
    parser.add_argument("--wait-for-go", action="store_true",
                        help="after the imports, wait for a 'go' line on stdin (lets the parent start "
                             "the next life's 3 s of imports while this one still trains)")
    parser.add_argument("--save-at-start", action="store_true",
                        help="checkpoint once right after the session is created (after a restore: "
                             "a re-save of the restored step)")
    parser.add_argument("--perturb", choices=("rng", "data"),
                        help="negative control: after a restore, reseed the generators or rewind the "
                             "data, as if the checkpoint had not held them")
    return parser.parse_args(argv)


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, seam: Seam,
                    sleep_secs: float) -> Callable[[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """One step that draws from every global generator, so a resume that lost any of them shows."""

    def train_step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        x = x + 0.05 * torch.randn_like(x)              # torch CPU generator (plus dropout)
        weight = 1.0 + 0.1 * random.random()            # Python's generator
        weight *= float(np.random.uniform(0.9, 1.1))    # NumPy's generator
        optimizer.zero_grad(set_to_none=True)
        loss = weight * nn.functional.cross_entropy(model(x), y)
        loss.backward()
        seam.maybe_die("step")                          # mid-step: gradients, no update yet
        if sleep_secs:
            time.sleep(sleep_secs)
        optimizer.step()
        return loss.detach()

    return train_step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    deterministic_algorithms()
    torch.set_num_threads(1)
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("supervisor").setLevel(logging.INFO)
    seam = Seam(os.environ.get(SEAM_ENV, ""))
    install_seams(seam)

    from hooks import StopAtStepHook
    from supervisor import MonitoredTrainingSession

    seed_everything()
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = make_batches()
    train_step = make_train_step(model, optimizer, seam, args.step_sleep_secs)
    print("ready", flush=True)
    if args.wait_for_go and sys.stdin.readline().strip() != "go":
        return  # the parent went away or cancelled this life
    with MonitoredTrainingSession(args.logdir, model=model, optimizer=optimizer, state={"data": batches},
                                  save_checkpoint_steps=args.save_steps, max_to_keep=args.max_to_keep,
                                  save_summaries_steps=None, log_step_count_steps=None, save_mode="async",
                                  hooks=[StopAtStepHook(last_step=args.steps)]) as s:
        leftovers = sorted(n for n in os.listdir(args.logdir) if ".tmp-" in n or ".deleting-" in n)
        print(f"transient after open: {leftovers}", flush=True)
        if args.save_at_start:
            s.save_checkpoint(wait=True)
        if args.perturb and s.global_step > 0:
            perturb(args.perturb, batches)
        while not s.should_stop():
            s.run(train_step, next(batches))
        step = s.global_step
    final = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": batches.state_dict(),
             "draws": (torch.rand(4), random.random(), float(np.random.random()))}
    torch.save(final, args.out)
    print(f"finished step={step}", flush=True)


def perturb(what: str, batches: ShuffledBatches) -> None:
    """The negative control's damage (``--perturb``)."""
    if what == "rng":
        random.seed(99)
        np.random.seed(99)
        torch.manual_seed(99)
    else:
        batches.load_state_dict({"epoch": 0, "position": 0})


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip the interpreter's 0.7 s teardown of torch's modules; all is written
