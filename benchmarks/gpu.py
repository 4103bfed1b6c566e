"""Checkpoints of a GPU training state, side by side on the same CUDA state (SPEC §14, §5.9).

One process, one device, one model + Adam state of ``--size-gib`` (default 2; 1–4 fits a
10-minute run on one GPU), a stack of ``--width``-square linear layers. Printed, as median
(min–max) over ``--rounds`` interleaved rounds, each with its §14 target:

- steps inside `MonitoredTrainingSession` saving every ``--every`` steps, for each capture the
  session accepts (``capture="blocking"``, ``capture="overlapped"``; a session without
  ``capture=`` is blocking, and overlapped is reported "not available"): a step without a save,
  the step whose boundary saves (its extra time over a step without a save is the **stall**),
  and the next step, which overlaps the copy (target: ≤ 1.05× a step without a save; overlapped
  stall ≤ 0.1× the pinned memcpy). The previous save's write is waited for before each saving
  step, untimed. A step's time is wall-clock until the *compute* stream is done
  (``torch.cuda.current_stream().synchronize()``: a copy on a side stream is not waited for,
  its contention is counted), and the compute stream's own time from ``torch.cuda.Event``s;
- a bare copy of every state tensor into kept pinned host buffers (``non_blocking``, then
  synchronize): the limit of a blocking capture;
- the overlapped capture's torn-write detection (supervisor/checkpoint/save/fingerprint.py): the
  fingerprint of the state on the device, as queued at the boundary (with every stream idle
  before and after; target ≤ 0.1× the pinned memcpy), and of the staged copy on the CPU, which
  the writer thread computes before it writes;
- DCP ``async_save`` until it returns: its default stager, and ``DefaultStager`` with async
  staging (then its ``staging_completion`` is waited for, untimed, as a user must before the next
  optimizer step); a failure is printed as the figure;
- ``torch.save`` + fsync; our save to commit (``save(wait=True)``) vs DCP ``save`` + fsync
  (target ≤ 0.7×);
- our verified restore onto the device vs DCP ``load`` (target ≤ 1.0×) and
  ``torch.load(map_location=device)``;
- exact resume: a run saving at step K, closed and resumed to 2K, equals an uninterrupted 2K-step
  run bit for bit (a model with dropout, Adam, on the device);
- the rank agreement on DDP models on the device: 2 gloo ranks (both on one GPU), rank 1 asks
  for a stop at step 5, both stop at step 6 with equal weights (benchmarks/_gpu_checks.py);
- overlapped detection on the device: fingerprints on the device equal those of the CPU copies,
  a write landing before a held copy discards that save, the next one commits the boundary's state.

``--device cpu`` (tiny state, CI's smoke test) runs the same code on the CPU.

Run: ``python benchmarks/gpu.py [--size-gib 2] [--device cuda|cpu] [--rounds 3]``
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (exact resume)

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _gpu_checks  # noqa: E402
from benchmarks._ranks import spread  # noqa: E402
from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager  # noqa: E402
from supervisor.checkpoint.save.fingerprint import Plan, fingerprints  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
FIGURES = ("pinned memcpy", "DCP async_save stall (default stager)",
           "DCP async_save stall (DefaultStager, async staging)", "torch.save + fsync", "ours: save to commit",
           "DCP save + fsync", "ours: verified restore", "DCP load", "torch.load(map_location)",
           "fingerprint on the device", "fingerprint of the staged copy (CPU)")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of ``fn()`` with every stream of ``device`` idle before and after."""
    gc.collect()
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def stall(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds until ``fn()`` returns and the compute stream is done (a side stream's copy is not
    waited for: that is the point of a non-blocking save)."""
    gc.collect()
    sync(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return time.perf_counter() - start


def fsync_tree(path: str) -> None:
    for name in [*os.listdir(path), "."]:
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def build(size_bytes: int, width: int, batch: int, device: torch.device) -> tuple[nn.Module, Any, Callable[[], Any]]:
    """A model whose parameters + Adam's two moments total ``size_bytes``, one step taken (so
    Adam's state exists), and its training step."""
    layers = max(1, round(size_bytes / 3 / (width * width * 4)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    x = torch.randn(batch, width, device=device)

    def train_step() -> dict[str, torch.Tensor]:
        optimizer.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    train_step()
    sync(device)
    return model, optimizer, train_step


def state_tensors(model: nn.Module, optimizer: Any) -> list[torch.Tensor]:
    found = list(model.state_dict().values())
    for per_param in optimizer.state.values():
        found += [t for t in per_param.values() if isinstance(t, torch.Tensor)]
    return found


def capture_modes() -> tuple[list[str], str | None]:
    """The captures the session accepts, and why overlapped is not measured (None if it is)."""
    import inspect

    from supervisor import MonitoredTrainingSession

    if "capture" not in inspect.signature(MonitoredTrainingSession).parameters:
        return ["blocking"], "not available (MonitoredTrainingSession has no capture= in this build)"
    return ["blocking", "overlapped"], None


def session_steps(model: nn.Module, optimizer: Any, train_step: Callable[[], Any], directory: str,
                  capture: str | None, every: int, rounds: int, device: torch.device) -> dict[str, list[float]]:
    """Per kind of step ("no save", "saving", "overlapping": the step after a save), the wall
    seconds and, on CUDA, the compute stream's own seconds (keys with " (gpu)")."""
    from supervisor import MonitoredTrainingSession

    extra = {} if capture is None else {"capture": capture}
    times: dict[str, list[float]] = {}
    with MonitoredTrainingSession(directory, model, optimizer, handle_signals=False, save_checkpoint_steps=every,
                                  save_checkpoint_secs=None, log_step_count_steps=None,
                                  save_summaries_steps=None, **extra) as session:
        manager = session.checkpoint_manager
        manager.wait()
        for _ in range(rounds * every + 1):
            step = session.global_step + 1
            kind = "saving" if step % every == 0 else "overlapping" if step % every == 1 and step > 1 else "no save"
            if kind == "saving":
                manager.wait()  # the previous save's write: not this step's figure
            wall, gpu = _one_step(session, train_step, device)
            times.setdefault(kind, []).append(wall)
            if gpu is not None:
                times.setdefault(f"{kind} (gpu)", []).append(gpu)
        manager.wait()
    return times


def _one_step(session: Any, train_step: Callable[[], Any], device: torch.device) -> tuple[float, float | None]:
    sync(device)
    events = None
    if device.type == "cuda":
        events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        events[0].record()
    start = time.perf_counter()
    session.run(train_step)
    if events is not None:
        events[1].record()
        torch.cuda.current_stream(device).synchronize()
    wall = time.perf_counter() - start
    return wall, (events[0].elapsed_time(events[1]) / 1e3 if events is not None else None)


class Round:
    """One round of the save and restore figures, on the live state."""

    def __init__(self, directory: str, model: nn.Module, optimizer: Any, device: torch.device) -> None:
        self.directory, self.model, self.optimizer, self.device = directory, model, optimizer, device
        self.state = TrainingState.from_arguments(model=model, optimizer=optimizer)
        self.tensors = state_tensors(model, optimizer)
        self.pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=device.type == "cuda") for t in self.tensors]
        self.ours = os.path.join(directory, "ours")
        self.dcp_dir, self.plain = os.path.join(directory, "dcp"), os.path.join(directory, "plain.pt")

    def user_sd(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def memcpy(self) -> None:
        for dst, src in zip(self.pinned, self.tensors):
            dst.copy_(src, non_blocking=True)

    def run(self, step: int, figures: dict[str, list[Any]]) -> None:
        device = self.device
        figures["pinned memcpy"].append(timed(self.memcpy, device))
        plan = Plan(self.tensors)
        figures["fingerprint on the device"].append(timed(lambda: fingerprints(plan, self.tensors), device))
        figures["fingerprint of the staged copy (CPU)"].append(timed(lambda: fingerprints(plan, self.pinned), device))
        figures[FIGURES[1]].append(_failure_as_figure(lambda: self._dcp_async(None)))
        figures[FIGURES[2]].append(_failure_as_figure(lambda: self._dcp_async(_async_stager(device))))
        figures["torch.save + fsync"].append(timed(lambda: _torch_save_fsync(self.user_sd(), self.plain), device))
        shutil.rmtree(self.ours, ignore_errors=True)
        with CheckpointManager(self.ours, max_to_keep=None) as manager:
            figures["ours: save to commit"].append(timed(lambda: manager.save(step, self.state, wait=True), device))
        figures["DCP save + fsync"].append(timed(self._dcp_save, device))
        os.sync()
        figures["ours: verified restore"].append(timed(self._restore, device))
        figures["DCP load"].append(timed(lambda: dcp.load(self.user_sd(), checkpoint_id=self.dcp_dir), device))
        figures["torch.load(map_location)"].append(
            timed(lambda: torch.load(self.plain, map_location=device, weights_only=True), device))
        shutil.rmtree(self.dcp_dir)
        os.remove(self.plain)

    def _dcp_async(self, stager: Any) -> float:
        target = self.dcp_dir + "-async"
        extra = {} if stager is None else {"async_stager": stager}
        holder: list[Any] = []
        seconds = stall(lambda: holder.append(dcp.async_save(self.user_sd(), checkpoint_id=target, **extra)),
                        self.device)
        response = holder[0]
        if hasattr(response, "staging_completion"):  # AsyncSaveResponse: staging, then upload
            response.staging_completion.result()
            response.upload_completion.result()
        else:
            response.result()
        if stager is not None and hasattr(stager, "close"):
            stager.close()
        shutil.rmtree(target, ignore_errors=True)
        return seconds

    def _dcp_save(self) -> None:
        dcp.save(self.user_sd(), checkpoint_id=self.dcp_dir)
        fsync_tree(self.dcp_dir)

    def _restore(self) -> None:
        fresh = CheckpointManager(self.ours, max_to_keep=None, verify="full")
        fresh.open()
        try:
            if fresh.restore(self.state) is None:
                raise RuntimeError("the engine found no checkpoint to restore")
        finally:
            fresh.close()


def _async_stager(device: torch.device) -> Any:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    # As torchtitan's "zero-overhead checkpointing" sets it (no shared memory: one process);
    # pinned memory and non-blocking copies need an accelerator (DCP refuses them on the CPU).
    cuda = device.type == "cuda"
    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=True, use_non_blocking_copy=cuda))


def _failure_as_figure(measure: Callable[[], float]) -> float | str:
    try:
        return measure()
    except Exception as e:  # noqa: BLE001 - a failure is the figure
        return f"FAILED: {type(e).__name__}: {e}"[:200]


def _torch_save_fsync(obj: object, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def median(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, float)]
    return statistics.median(numbers) if len(numbers) == len(values) and numbers else None


def shown(values: list[Any]) -> str:
    failures = [v for v in values if isinstance(v, str)]
    return failures[0] if failures else spread(values, "{:.4f}")


def ratio_line(name: str, ours: float | None, theirs: float | None, target: float | None, info: str = "") -> str:
    if ours is None or theirs is None:
        return f"  {name:<58s} n/a ({info or 'a side failed or is not available'})"
    ratio = ours / theirs
    verdict = "(info)" if target is None else ("ok" if ratio <= target else "MISSES TARGET")
    bound = "" if target is None else f"target <= {target:g}x  "
    return f"  {name:<58s} {ratio:7.3f}x  {bound}{verdict}"


def report_steps(times: dict[str, dict[str, list[float]]], unavailable: str | None) -> dict[str, float | None]:
    print("steps inside MonitoredTrainingSession, seconds, median (min-max); wall: until the compute stream is "
          "done; gpu: the compute stream's own time (CUDA events):")
    stalls: dict[str, float | None] = {}
    for mode, figures in times.items():
        for kind in ("no save", "saving", "overlapping"):
            gpu = f"   gpu {shown(figures[kind + ' (gpu)'])}" if kind + " (gpu)" in figures else ""
            print(f"  capture={mode:<11s} {kind + ' step':<18s} wall {shown(figures[kind])}{gpu}")
        plain = statistics.median(figures["no save"])
        stalls[mode] = statistics.median(figures["saving"]) - plain
        stalls[f"{mode} overlapping"] = statistics.median(figures["overlapping"]) / plain
        print(f"  capture={mode:<11s} stall = saving step - step without a save: {stalls[mode]:.4f} s")
    if unavailable is not None:
        print(f"  capture=overlapped: {unavailable}")
        stalls["overlapped"] = stalls["overlapped overlapping"] = None
    return stalls


def report(figures: dict[str, list[Any]], stalls: dict[str, float | None], unavailable: str | None) -> None:
    print("save and restore of the same state, seconds, median (min-max):")
    for name in FIGURES:
        print(f"  {name:<58s} {shown(figures[name])}")
    m = {name: median(values) for name, values in figures.items()}
    print("ratios (section 14 targets):")
    lines = [
        ("blocking stall / pinned memcpy", stalls["blocking"], m["pinned memcpy"], None),
        ("overlapped stall / pinned memcpy", stalls["overlapped"], m["pinned memcpy"], 0.1),
        ("device fingerprint / pinned memcpy", m["fingerprint on the device"], m["pinned memcpy"], 0.1),
        ("staged-copy fingerprint (CPU) / pinned memcpy", m["fingerprint of the staged copy (CPU)"],
         m["pinned memcpy"], None),
        ("overlapping step / step without a save (overlapped)", stalls["overlapped overlapping"], 1.0, 1.05),
        ("step after a save / step without a save (blocking)", stalls["blocking overlapping"], 1.0, None),
        ("blocking stall / DCP async_save (default stager)", stalls["blocking"], m[FIGURES[1]], 0.5),
        ("overlapped stall / DCP async_save (DefaultStager, async)", stalls["overlapped"], m[FIGURES[2]], None),
        ("save to commit / DCP save", m["ours: save to commit"], m["DCP save + fsync"], 0.7),
        ("verified restore / DCP load", m["ours: verified restore"], m["DCP load"], 1.0),
        ("verified restore / torch.load(map_location)", m["ours: verified restore"],
         m["torch.load(map_location)"], None),
    ]
    for name, ours, theirs, target in lines:
        info = unavailable if "overlap" in name and stalls["overlapped"] is None else ""
        print(ratio_line(name, ours, theirs, target, info or ""))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size-gib", type=float, default=None, help="model + Adam state (default: 2 on "
                        "CUDA, 0.01 on the CPU)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--every", type=int, default=4, help="the session saves every this many steps")
    parser.add_argument("--width", type=int, default=None, help="layer width (default 4096 CUDA, 256 CPU)")
    parser.add_argument("--batch", type=int, default=None, help="batch rows (default 2048 CUDA, 32 CPU)")
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary "
                        "directory; put it on the disk you train on)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; pass --device cpu")
    size = int((args.size_gib if args.size_gib is not None else (2.0 if cuda else 0.01)) * GiB)
    width, batch = args.width or (4096 if cuda else 256), args.batch or (2048 if cuda else 32)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return _run(tmp, device, size, width, batch, args)


def _run(tmp: str, device: torch.device, size: int, width: int, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    model, optimizer, train_step = build(size, width, batch, device)
    nbytes = sum(t.numel() * t.element_size() for t in state_tensors(model, optimizer))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}: model + Adam state {nbytes / MiB:.0f} MiB "
          f"({len(model)} x Linear({width}, {width})), batch {batch}, {args.rounds} rounds\n")
    figures: dict[str, list[Any]] = {figure: [] for figure in FIGURES}
    one_round = Round(os.path.join(tmp, "round"), model, optimizer, device)
    one_round.memcpy()  # pinned pages touched once, as a kept staging buffer's are
    for step in range(1, args.rounds + 1):
        one_round.run(step, figures)
    del one_round
    modes, unavailable = capture_modes()
    times = {mode: session_steps(model, optimizer, train_step, os.path.join(tmp, f"session-{mode}"),
                                 mode if unavailable is None else None, args.every, args.rounds, device)
             for mode in modes}
    stalls = report_steps(times, unavailable)
    report(figures, stalls, unavailable)
    resume = _gpu_checks.exact_resume(os.path.join(tmp, "resume"), device)
    print(f"exact resume on {device.type}: {'ok' if resume[0] else 'FAILED'}: {resume[1]}")
    agreement = _gpu_checks.ddp_agreement(device)
    print(f"rank agreement on {device.type} DDP models (2 gloo ranks): {'ok' if agreement[0] else 'FAILED'}: "
          f"{agreement[1]}")
    detection = _gpu_checks.overlapped_detection(os.path.join(tmp, "detection"), device)
    print(f"overlapped detection on {device.type}: {'ok' if detection[0] else 'FAILED'}: {detection[1]}")
    return {"figures": figures, "steps": times, "stalls": stalls, "resume": resume, "agreement": agreement,
            "detection": detection}


if __name__ == "__main__":
    main()
