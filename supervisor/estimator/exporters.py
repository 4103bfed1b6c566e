"""Exporters: write the evaluated model out after evaluations (SPEC §10.3).

An export is a directory ``<export_dir_base>/<timestamp>/`` holding:

- ``model.pt`` — the model's state dict, loadable with ``torch.load(path, weights_only=True)``;
- ``model.safetensors`` — when the ``safetensors`` package is installed (``pip install
  torch-supervisor[safetensors]``): the same weights, for ``safetensors.torch.load_model(model,
  path)`` or any safetensors reader (tied weights are stored once, as ``save_model`` does);
- ``eval_result.json`` — ``{"global_step", "checkpoint_path", "metrics"}``;
- ``model.pt2`` — when the estimator has an ``example_input``: a ``torch.export`` program that
  ``torch.export.load(path).module()(*example_input)`` runs without the model's Python class
  (the batch dimension is exported as dynamic where the model allows it).

It is written into a temporary sibling directory, fsynced, and renamed into place, so a crash
never leaves a partial export under a timestamp name, only a hidden
``.<version>.tmp-<host>-<pid>-<random>`` directory, which listings ignore. The next export into
the same directory deletes such leftovers when they are from this host and their process is
gone (a temp of a live process — another exporter still writing — or of another host, which
this one cannot check, is left alone). Versions are the export's
Unix time in seconds, bumped past the newest existing one, so they always sort in export order. ``train_and_evaluate`` calls each
exporter after each evaluation with ``export_path = model_dir/export/<name>``.

- `LatestExporter` exports after every evaluation and keeps the newest ``exports_to_keep``.
- `BestExporter` exports when the evaluation beats the best so far (``compare_fn``; default a
  lower ``loss``). After a restart it learns the best so far from its own exports' records
  (``eval_result.json``) or, when it has none, from the eval event files — so it never
  re-exports a model worse than one it exported before (TF's BestExporter forgot).
- `FinalExporter` exports once, after the evaluation of the final checkpoint.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
import re
import shutil
import socket
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch

from supervisor._validate import check_int
from supervisor.checkpoint.fileio import fsync_dir

if TYPE_CHECKING:
    from supervisor.estimator.estimator import Estimator

__all__ = ["Exporter", "LatestExporter", "BestExporter", "FinalExporter", "write_export", "list_exports",
           "remove_crashed_exports",
           "WEIGHTS_FILE", "PROGRAM_FILE", "RESULT_FILE", "SAFETENSORS_FILE"]

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.pt"
PROGRAM_FILE = "model.pt2"
SAFETENSORS_FILE = "model.safetensors"
RESULT_FILE = "eval_result.json"


def write_export(estimator: Estimator, export_dir_base: str, checkpoint_path: str,
                 eval_result: Mapping[str, Any] | None) -> str:
    """Exports ``checkpoint_path`` into a new ``<export_dir_base>/<timestamp>/``; returns it."""
    from supervisor.estimator.estimator import preserved_rng

    os.makedirs(export_dir_base, exist_ok=True)
    remove_crashed_exports(export_dir_base)
    final = _new_version_dir(export_dir_base, int(estimator.clock.time()))
    tmp = os.path.join(export_dir_base, f".{os.path.basename(final)}.tmp-{socket.gethostname()}-{os.getpid()}-"
                                        f"{os.urandom(8).hex()}")
    os.makedirs(tmp)
    try:
        with preserved_rng():
            model, step = estimator.load_model_copy(checkpoint_path)
            _save_file(os.path.join(tmp, WEIGHTS_FILE), lambda f: torch.save(model.state_dict(), f))
            _save_safetensors(model, os.path.join(tmp, SAFETENSORS_FILE), step)
            if estimator.example_input is not None:
                program = export_program(model, estimator.example_input)
                _save_file(os.path.join(tmp, PROGRAM_FILE), lambda f: torch.export.save(program, f))
        record = {"global_step": step, "checkpoint_path": checkpoint_path,
                  "metrics": {k: v for k, v in (eval_result or {}).items() if k != "global_step"}}
        _save_file(os.path.join(tmp, RESULT_FILE), lambda f: f.write(json.dumps(record, indent=2).encode()))
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(export_dir_base)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported the checkpoint of step %d to %s", step, final)
    return final


def export_program(model: torch.nn.Module, example_input: Any) -> Any:
    """``torch.export`` of ``model`` on ``example_input`` (a tensor or a tuple of positional
    arguments), with the first dimension of every tensor argument dynamic where the model allows
    it (``Dim.AUTO``), so the program accepts other batch sizes than the example's."""
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    dynamic = tuple({0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) and a.dim() > 0 else None
                    for a in args)
    return torch.export.export(model, args, dynamic_shapes=dynamic)


def _save_safetensors(model: torch.nn.Module, path: str, step: int) -> None:
    """``model.safetensors`` when the package is installed (else nothing), fsynced."""
    try:
        from safetensors.torch import save_model
    except ImportError:
        return
    save_model(model, path, metadata={"global_step": str(step)})
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _save_file(path: str, fill: Callable[[Any], Any]) -> None:
    with open(path, "xb") as f:
        fill(f)
        f.flush()
        os.fsync(f.fileno())


_TEMP = re.compile(r"^\.\d+\.tmp-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{16}$")


def remove_crashed_exports(export_dir_base: str) -> list[str]:
    """Deletes the temp directories of exports whose process died (see the module docstring);
    returns their paths. Only this host's, and only when their process no longer exists."""
    try:
        names = os.listdir(export_dir_base)
    except FileNotFoundError:
        return []
    host, removed = socket.gethostname(), []
    for name in names:
        match = _TEMP.match(name)
        if match is None or match["host"] != host or _process_exists(int(match["pid"])):
            continue
        path = os.path.join(export_dir_base, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            logger.info("removed %s, left by an export whose process (pid %s) died", path, match["pid"])
            removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, owned by someone else
        return True
    return True


def _new_version_dir(base: str, timestamp: int) -> str:
    versions = [int(v) for v, _ in list_exports(base)]
    version = max([timestamp] + [v + 1 for v in versions])
    return os.path.join(base, str(version))


def list_exports(export_path: str) -> list[tuple[str, str]]:
    """``(version, path)`` of the complete exports under ``export_path``, oldest first."""
    try:
        names = os.listdir(export_path)
    except FileNotFoundError:
        return []
    found = [(int(n), n) for n in names if n.isdigit() and os.path.isdir(os.path.join(export_path, n))]
    return [(n, os.path.join(export_path, n)) for _, n in sorted(found)]


class Exporter:
    """Base class: ``export(...)`` is called after each evaluation of `train_and_evaluate`.

    Args:
        name: the exporter's directory name under ``model_dir/export``.
        exports_to_keep: how many exports to keep (None: all); older ones are deleted.
    """

    def __init__(self, name: str, exports_to_keep: int | None = 5) -> None:
        if not isinstance(name, str) or not name or os.sep in name:
            raise ValueError(f"exporter name must be a non-empty string without {os.sep!r}, got {name!r}")
        if exports_to_keep is not None and not (isinstance(exports_to_keep, int) and exports_to_keep > 0):
            raise ValueError(f"`exports_to_keep`, if provided, must be a positive number, got {exports_to_keep!r}")
        self._name = name
        self._exports_to_keep = check_int("exports_to_keep", exports_to_keep, minimum=1, allow_none=True)

    @property
    def name(self) -> str:
        return self._name

    def export(self, estimator: Estimator, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        """Exports (or not) the evaluated checkpoint; returns the export's path or None."""
        raise NotImplementedError

    def _export_and_collect(self, estimator: Estimator, export_path: str, checkpoint_path: str,
                            eval_result: Mapping[str, Any]) -> str:
        path = estimator.export(export_path, checkpoint_path, eval_result=eval_result)
        self._garbage_collect(export_path)
        return path

    def _garbage_collect(self, export_path: str) -> None:
        if self._exports_to_keep is None:
            return
        for _, path in list_exports(export_path)[:-self._exports_to_keep]:
            aside = os.path.join(export_path, f".{os.path.basename(path)}.deleting-{os.urandom(8).hex()}")
            os.rename(path, aside)  # atomic: readers never see a half-deleted export
            shutil.rmtree(aside, ignore_errors=True)
            logger.info("deleted the old export %s (exports_to_keep=%d)", path, self._exports_to_keep)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r})"


class LatestExporter(Exporter):
    """Exports after every evaluation; keeps the newest ``exports_to_keep``."""

    def __init__(self, name: str = "latest_exporter", exports_to_keep: int | None = 5) -> None:
        super().__init__(name, exports_to_keep)

    def export(self, estimator: Estimator, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        return self._export_and_collect(estimator, export_path, checkpoint_path, eval_result)


class FinalExporter(Exporter):
    """Exports once, after the evaluation of the final checkpoint (``is_the_final_export``)."""

    def __init__(self, name: str = "final_exporter") -> None:
        super().__init__(name, exports_to_keep=None)

    def export(self, estimator: Estimator, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        if not is_the_final_export:
            return None
        return estimator.export(export_path, checkpoint_path, eval_result=eval_result)


def loss_smaller(best_eval_result: Mapping[str, Any], current_eval_result: Mapping[str, Any]) -> bool:
    """The default `BestExporter` comparison: whether the current ``loss`` is lower."""
    for which, result in (("best_eval_result", best_eval_result), ("current_eval_result", current_eval_result)):
        if not result or "loss" not in result:
            raise ValueError(f"{which} cannot be empty or have no loss in it (got {result!r}); pass a "
                             "compare_fn to BestExporter for other metrics")
    return current_eval_result["loss"] < best_eval_result["loss"]


class BestExporter(Exporter):
    """Exports when an evaluation beats the best so far (TF's ``BestExporter``, restart-safe).

    Args:
        name: directory name under ``model_dir/export``.
        compare_fn: ``compare_fn(best_eval_result, current_eval_result) -> bool``, True when
            the current result is better (default: lower ``loss``).
        exports_to_keep: how many exports to keep (None: all).
        eval_dir: where the evaluations' events are (default: the eval directory of the
            `EvalSpec` it runs with, ``model_dir/eval`` or ``eval_<name>``); read on the first
            call when this exporter has no export records yet.
    """

    def __init__(self, name: str = "best_exporter", compare_fn: Callable[[Any, Any], bool] | None = None,
                 exports_to_keep: int | None = 5, *, eval_dir: str | os.PathLike | None = None) -> None:
        super().__init__(name, exports_to_keep)
        self._compare_fn = _check_compare_fn(compare_fn)
        self._eval_dir = None if eval_dir is None else os.fspath(eval_dir)
        self._default_eval_dir: str | None = None
        self._best: dict[str, Any] | None = None
        self._loaded = False

    def set_default_eval_dir(self, eval_dir: str) -> None:
        """The eval directory to read when none was given (set by `train_and_evaluate`)."""
        self._default_eval_dir = eval_dir

    def export(self, estimator: Estimator, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        current = dict(eval_result)
        if not self._loaded:
            self._best = self._best_so_far(estimator, export_path, current.get("global_step"))
            self._loaded = True
        if self._best is not None and not self._compare_fn(self._best, current):
            logger.info("%s: not exporting step %s, not better than the best so far (%s)",
                        self.name, current.get("global_step"), self._best)
            return None
        self._best = current
        return self._export_and_collect(estimator, export_path, checkpoint_path, current)

    def _best_so_far(self, estimator: Estimator, export_path: str, current_step: Any) -> dict[str, Any] | None:
        candidates = [record for _, path in list_exports(export_path)
                      if (record := _read_record(path)) is not None]
        if not candidates:
            from hooks.early_stopping import read_eval_metrics

            eval_dir = self._eval_dir or self._default_eval_dir or estimator.eval_dir()
            candidates = [dict(metrics, global_step=step) for step, metrics in read_eval_metrics(eval_dir).items()
                          if step != current_step]
        best = None
        for candidate in candidates:
            if best is None or self._compare_fn(best, candidate):
                best = candidate
        if best is not None:
            logger.info("%s: the best evaluation so far is %s", self.name, best)
        return best


def _read_record(export_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(export_dir, RESULT_FILE), encoding="utf-8") as f:
            record = json.load(f)
        return dict(record["metrics"], global_step=record["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("ignoring the export record of %s: %s", export_dir, e)
        return None


def _check_compare_fn(compare_fn: Any) -> Callable[[Any, Any], bool]:
    if compare_fn is None:
        return loss_smaller
    if not callable(compare_fn):
        raise TypeError(f"compare_fn must be callable as compare_fn(best_eval_result, current_eval_result), "
                        f"got {compare_fn!r}")
    params = list(inspect.signature(compare_fn).parameters)
    for required in ("best_eval_result", "current_eval_result"):
        if required not in params:
            raise ValueError(f"compare_fn ({compare_fn!r}) must include {required} argument; define it as "
                             "def compare_fn(best_eval_result, current_eval_result): ...")
    return compare_fn
