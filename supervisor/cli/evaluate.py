"""``evaluate LOGDIR --model pkg.module:factory ...``: the sidecar evaluator as a process (SPEC §10.4, §13).

Evaluates each new checkpoint a trainer commits to ``LOGDIR`` (`SidecarEvaluator`) and writes
the metrics to ``LOGDIR/eval`` (or ``eval_<name>``), printing one line per evaluation. It takes
no lock and writes nothing into the trainer's files.

``--model`` names a function returning either the ``torch.nn.Module`` to evaluate, or a dict with
``"model"`` and optionally ``"data"``, ``"eval_step"`` and ``"metrics"`` (so one factory can
configure everything). ``--data`` names a function returning the evaluation batches (called for
every evaluation); ``--eval-step`` a function ``eval_step(model, batch) -> {name: scalar}``
(default: ``model(batch)``). A name is ``package.module:function`` (imported; the current
directory is on the path) or ``path/to/file.py:function``.

It stops — exit code 0 — after ``--max-evaluations``, when the trainer marks the run finished
(after evaluating its final checkpoint), after ``--timeout`` seconds without a new checkpoint,
or at SIGTERM/SIGINT. Exit code 1: an evaluation failed (e.g. the checkpoint does not fit the
model); 2: usage error (a name that cannot be imported, bad arguments).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
from typing import Any, Callable, Mapping

__all__ = ["add_parser", "run", "load_object"]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("evaluate", help="the sidecar evaluator: evaluate each new checkpoint of LOGDIR",
                              description=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(p)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("logdir", metavar="LOGDIR", help="the trainer's log directory")
    p.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                   help="function returning the model (or a dict with model/data/eval_step/metrics)")
    p.add_argument("--data", metavar="MODULE:FACTORY", help="function returning the evaluation batches")
    p.add_argument("--eval-step", metavar="MODULE:FUNCTION",
                   help="eval_step(model, batch) -> {name: scalar} (default: model(batch))")
    p.add_argument("--steps", type=int, metavar="N", help="batches per evaluation (default: all)")
    p.add_argument("--max-evaluations", type=int, metavar="N", help="stop after N evaluations")
    p.add_argument("--name", help="write to LOGDIR/eval_NAME instead of LOGDIR/eval")
    p.add_argument("--log-dir", metavar="DIR", help="write the metrics' events here instead")
    p.add_argument("--timeout", type=float, metavar="SECS",
                   help="stop after SECS without a new checkpoint (default: wait forever)")
    p.add_argument("--poll-secs", type=float, default=1.0, metavar="SECS",
                   help="how often to look for a new checkpoint (default: 1)")


def run(args: argparse.Namespace) -> int:
    """Runs the evaluator; returns the exit code."""
    from supervisor.errors import SupervisorError

    try:
        evaluator = _build(args)
    except (UsageError, TypeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _stop_on_signals(evaluator.stop):
            for result in evaluator.evaluations():
                metrics = ", ".join(f"{k} = {v:.6g}" for k, v in sorted(result.metrics.items()) if k != "global_step")
                print(f"step {result.step}: {metrics}", flush=True)
    except (SupervisorError, OSError, RuntimeError, TypeError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    stats = evaluator.stats
    print(f"stopped ({evaluator.stop_reason}): {stats.evaluated} evaluated, {stats.vanished} deleted before "
          f"they could be read, {stats.corrupt} damaged, {stats.skipped} already evaluated", flush=True)
    return EXIT_OK


def _build(args: argparse.Namespace) -> Any:
    from supervisor.estimator.sidecar import SidecarEvaluator

    if not os.path.isdir(args.logdir):
        os.makedirs(args.logdir, exist_ok=True)  # the trainer may not have started yet
    made = load_object(args.model, "--model")()
    parts: dict[str, Any] = dict(made) if isinstance(made, Mapping) else {"model": made}
    unknown = set(parts) - {"model", "data", "eval_step", "metrics"}
    if "model" not in parts or unknown:
        raise UsageError(f"--model {args.model} returned a dict with keys {sorted(parts)}; it needs 'model' and "
                         "may have 'data', 'eval_step', 'metrics'")
    if args.data:
        parts["data"] = load_object(args.data, "--data")  # called afresh for every evaluation
    if args.eval_step:
        parts["eval_step"] = load_object(args.eval_step, "--eval-step")
    if parts.get("data") is None:
        raise UsageError("no evaluation data: pass --data MODULE:FACTORY (or return a 'data' entry from --model)")
    return SidecarEvaluator(parts["model"], parts["data"], args.logdir, steps=args.steps,
                            max_evaluations=args.max_evaluations, metrics=parts.get("metrics"),
                            eval_step=parts.get("eval_step"), log_dir=args.log_dir, name=args.name,
                            timeout=args.timeout, poll_secs=args.poll_secs)


def load_object(spec: str, option: str = "name") -> Callable[..., Any]:
    """Imports ``package.module:attr`` or ``path/to/file.py:attr``; `UsageError` says what failed."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{option} must look like package.module:function or path/file.py:function, got {spec!r}")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            module = _import_file(module_name)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"{option} {spec}: cannot import {module_name} ({e})") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{option} {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{option} {spec}: {attr} is not callable")
    return obj


def _import_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise ImportError(f"no file {path}")
    name = f"_supervisor_evaluate_{os.path.splitext(os.path.basename(path))[0]}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == os.path.abspath(path):
        return sys.modules[name]  # --model, --data and --eval-step may name the same file
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _stop_on_signals:
    """SIGTERM/SIGINT → ``stop()`` (the evaluator ends at its next wait; exit code 0)."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        # The handler may interrupt code holding the stop event's lock: set it from a thread.
        threading.Thread(target=self._stop, name="supervisor-evaluate-stop", daemon=True).start()

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def main(argv: list[str] | None = None) -> int:
    """``python -m supervisor.cli.evaluate ...`` (the same as ``python -m supervisor evaluate ...``)."""
    import logging

    parser = argparse.ArgumentParser(prog="python -m supervisor evaluate",
                                     description=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
