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

``LOGDIR`` may be an ``s3://bucket/prefix`` URL (the client configured by the ``AWS_*``
environment or ``--storage-options JSON``); the events then go to ``LOGDIR/eval`` on the object
store, one new object per evaluation. A missing bucket is a usage error (exit code 2).

It never creates ``LOGDIR``: one that does not exist yet is waited for (a trainer started at
the same time creates it), and it says on stderr what it waits for — the first checkpoint in
which directory — so a mistyped path does not wait in silence (``--timeout`` bounds the wait).

It stops — exit code 0 — after ``--max-evaluations``, when the trainer marks the run finished
(after evaluating its final checkpoint), after ``--timeout`` seconds without a new checkpoint,
or at SIGTERM/SIGINT. Exit code 1: an evaluation failed (e.g. the checkpoint does not fit the
model, or ``--data`` raised); 2: usage error, found before anything is evaluated: a name that
cannot be imported or whose import raises, a ``--model`` factory that raises, bad arguments,
``LOGDIR`` or ``--log-dir`` not a directory (a file, or under a file), ``LOGDIR`` a checkpoint
directory or a directory of log directories.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import signal
import stat
import sys
import threading
import traceback
from typing import Any, Callable, Mapping

from supervisor.checkpoint import read_index
from supervisor.cli._common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, help_text, output_cut_short
from supervisor.cli._paths import advice, path_kind
from supervisor.cli._remote import UrlProblem, add_storage_options, connect, is_checkpoint, is_url
from supervisor.errors import SupervisorError

__all__ = ["add_parser", "run", "load_object"]


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


class UserCodeError(RuntimeError):
    """A function named on the command line raised while evaluating (exit code 1)."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("evaluate", help="the sidecar evaluator: evaluate each new checkpoint of LOGDIR",
                              **_described())
    _add_arguments(p)
    return p


def _described() -> dict[str, Any]:
    """The parser's description (this module's docstring after its first line), as written."""
    return {"description": help_text(__doc__.split("\n\n", 1)[1]),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


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
    add_storage_options(p)


def run(args: argparse.Namespace) -> int:
    """Runs the evaluator; returns the exit code."""
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
    except BrokenPipeError:
        raise  # stdout's reader went away (`| head`): the caller ends quietly
    except UserCodeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    except (SupervisorError, OSError, RuntimeError, TypeError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    stats = evaluator.stats
    print(f"stopped ({evaluator.stop_reason}): {stats.evaluated} evaluated, {stats.vanished} deleted before "
          f"they could be read, {stats.corrupt} damaged, {stats.skipped} already evaluated", flush=True)
    return EXIT_OK


def _build(args: argparse.Namespace) -> Any:
    # Lazy: the estimator is heavy, and every subcommand's module is imported to build the parser.
    from supervisor.estimator import SidecarEvaluator

    waiting = _check_directories(args)  # before importing anything: a wrong path is the cheapest mistake
    parts = _factory_parts(args)
    if args.data:
        parts["data"] = _reporting(load_object(args.data, "--data"), "--data", args.data)  # called per evaluation
    if args.eval_step:
        parts["eval_step"] = load_object(args.eval_step, "--eval-step")
    if parts.get("data") is None:
        raise UsageError("no evaluation data: pass --data MODULE:FACTORY (or return a 'data' entry from --model)")
    evaluator = SidecarEvaluator(parts["model"], parts["data"], args.logdir, steps=args.steps,
                                 max_evaluations=args.max_evaluations, metrics=parts.get("metrics"),
                                 eval_step=parts.get("eval_step"), log_dir=args.log_dir, name=args.name,
                                 timeout=args.timeout, poll_secs=args.poll_secs,
                                 storage_options=args.storage_options if is_url(args.logdir) else None)
    if waiting:
        print(waiting, file=sys.stderr, flush=True)
    return evaluator


def _factory_parts(args: argparse.Namespace) -> dict[str, Any]:
    """Calls the ``--model`` factory: ``{"model": ..., maybe "data", "eval_step", "metrics"}``."""
    factory = load_object(args.model, "--model")
    try:
        made = factory()
    except Exception as e:  # the user's code: any error is reported in one line naming --model
        raise UsageError(f"--model {args.model}: calling it raised {_cause(e)}") from e
    parts: dict[str, Any] = dict(made) if isinstance(made, Mapping) else {"model": made}
    unknown = set(parts) - {"model", "data", "eval_step", "metrics"}
    if "model" not in parts or unknown:
        raise UsageError(f"--model {args.model} returned a dict with keys {sorted(parts)}; it needs 'model' and "
                         "may have 'data', 'eval_step', 'metrics'")
    return parts


def _check_directories(args: argparse.Namespace) -> str | None:
    """Refuses a ``LOGDIR`` or ``--log-dir`` that cannot be (or become) the directory it names;
    returns the line saying what the evaluator waits for when ``LOGDIR`` has no checkpoint yet."""
    if is_url(args.logdir):
        return _check_url(args)
    found = path_kind(args.logdir)
    wrong = advice(found, "evaluate", accepts=("logdir",))
    if wrong:
        raise UsageError(f"LOGDIR {wrong}")
    blocked = _under_a_file(found.path)
    if blocked:
        raise UsageError(f"LOGDIR {found.path} can never exist: {blocked} is a file")
    if args.log_dir is not None:
        log_dir = os.path.abspath(args.log_dir)
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise UsageError(f"--log-dir {args.log_dir} is a file, not a directory: pass a directory for the "
                             "evaluation events (it is created if missing)")
        blocked = _under_a_file(log_dir)
        if blocked:
            raise UsageError(f"--log-dir {args.log_dir} cannot be created: {blocked} is a file")
    if found.kind == "missing":
        return (f"waiting for the first checkpoint in {found.path}, which does not exist yet (the trainer creates "
                "it; this command never does; stop with Ctrl-C, or pass --timeout SECS)")
    if _no_checkpoint_yet(found.path):
        return (f"waiting for the first checkpoint in {found.path} (none committed yet; stop with Ctrl-C, or "
                "pass --timeout SECS)")
    return None


def _check_url(args: argparse.Namespace) -> str | None:
    """`_check_directories` for an ``s3://`` LOGDIR: a missing bucket never appears (a trainer
    does not create buckets), a missing prefix is waited for."""
    url = args.logdir.rstrip("/")
    try:
        storage = connect(url, args)
    except UrlProblem as e:
        raise UsageError(f"LOGDIR {e}") from None
    if is_checkpoint(storage, url):
        raise UsageError(f"LOGDIR {url} is a checkpoint, not a log directory; run `evaluate {storage.dirname(url)}`")
    try:
        names = storage.listdir(url)
    except FileNotFoundError as e:
        raise UsageError(f"LOGDIR {url} can never exist: {e.strerror or e}") from None
    except OSError as e:
        raise UsageError(f"LOGDIR {url} cannot be listed: {e}") from None
    if not names or "checkpoint" not in names:
        return (f"waiting for the first checkpoint in {url} (none committed yet; stop with Ctrl-C, or pass "
                "--timeout SECS)")
    return None


def _under_a_file(path: str) -> str | None:
    """The nearest existing ancestor of ``path`` when it is not a directory (then ``path`` can
    never be created), else None."""
    parent = os.path.dirname(path)
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    try:
        return None if stat.S_ISDIR(os.stat(parent).st_mode) else parent
    except OSError:
        return None


def _no_checkpoint_yet(logdir: str) -> bool:
    try:
        return read_index(logdir) is None
    except (ValueError, OSError):
        return False  # an index that exists but is unreadable: the evaluator reports it


def _cause(e: BaseException) -> str:
    """``Type: message (file.py, line N)`` in one line; the place is the innermost frame that is
    not Python's import machinery (a SyntaxError's message already names its place)."""
    message = " ".join(str(e).split())
    text = f"{type(e).__name__}: {message}" if message else type(e).__name__
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]
    if frames and not isinstance(e, SyntaxError):
        text += f" ({os.path.basename(frames[-1].filename)}, line {frames[-1].lineno})"
    return text


def _reporting(function: Callable[..., Any], option: str, spec: str) -> Callable[..., Any]:
    """``function``, whose errors name the option that named it (`UserCodeError`)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as e:
            raise UserCodeError(f"{option} {spec} raised {_cause(e)}") from e
    return call


def load_object(spec: str, option: str = "name") -> Callable[..., Any]:
    """Imports ``package.module:attr`` or ``path/to/file.py:attr``; `UsageError` says what failed
    (also when importing the module raises: a syntax error, a missing dependency, ...)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{option} must look like package.module:function or path/file.py:function, got {spec!r}")
    is_file = module_name.endswith(".py") or os.sep in module_name
    if is_file and not os.path.isfile(module_name):
        raise UsageError(f"{option} {spec}: there is no file {module_name}")
    try:
        if is_file:
            module = _import_file(module_name)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except Exception as e:  # the user's code runs at import: any error is reported in one line
        raise UsageError(f"{option} {spec}: cannot import {module_name}: {_cause(e)}") from e
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"{option} {spec}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{option} {spec}: {attr} is not callable")
    return obj


def _import_file(path: str) -> Any:
    name = f"_supervisor_evaluate_{os.path.splitext(os.path.basename(path))[0]}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == os.path.abspath(path):
        return sys.modules[name]  # --model, --data and --eval-step may name the same file
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a half-run module is not reused by --data/--eval-step naming the same file
        raise
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
    parser = argparse.ArgumentParser(prog="python -m supervisor evaluate", **_described())
    _add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        code = run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return output_cut_short()
    return code


if __name__ == "__main__":
    sys.exit(main())
