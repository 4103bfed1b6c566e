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

Every file is written with the mode the process's umask gives (0644 under the usual 022).

It is written into a temporary sibling directory, fsynced, and renamed into place, so a crash
never leaves a partial export under a timestamp name, only a hidden
``.<version>.tmp-<host>-<pid>-<random>`` directory, which listings ignore. Old exports are
deleted (``exports_to_keep``) by renaming them to a hidden ``.<version>.deleting-<random>``
first, so a kill mid-delete leaves no half export either. Each exporter's first call in a process,
and every export, deletes such leftovers: ``.deleting-`` ones always, temps when they are from
this host and their process is gone (a temp of a live process — another exporter still writing
— or of another host, which this one cannot check, is left alone). Versions are the export's
Unix time in seconds, bumped past the newest existing one, so they always sort in export order.

On an object store (``model_dir`` or ``export_dir_base`` an ``s3://`` URL; SPEC §16) there is no
rename: the files are uploaded to ``<base>/<version>/`` and its ``MANIFEST.json`` is written last,
create-only, as for checkpoints; an export exists if and only if its manifest does, a version
without one (a killed export) is removed with a WARNING by the next export or exporter, and the
garbage collection deletes a version's manifest first (`supervisor.estimator.export.objects`).
The exporters use the estimator's ``RunConfig(storage_options=...)``; `Estimator.export` also
takes ``storage_options=`` for a base on another store. Read an export back from a URL with
`open_export_file` (``torch.load(open_export_file(url, "model.pt", opts), weights_only=True)``).
``train_and_evaluate`` calls each exporter after each evaluation with
``export_path = model_dir/export/<name>``.

- `LatestExporter` exports after every evaluation and keeps the newest ``exports_to_keep``.
- `BestExporter` exports when the evaluation beats the best so far (``compare_fn``; default a
  lower ``loss``), and survives restarts and kills (TF's BestExporter forgot its best); see
  its docstring for the rules.
- `FinalExporter` exports once, after the evaluation of the final checkpoint.
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import Any, Callable, Mapping

from supervisor.errors import CheckpointError
from supervisor.estimator.export.files import (
    PROGRAM_FILE,
    RESULT_FILE,
    SAFETENSORS_FILE,
    WEIGHTS_FILE,
    checkpoint_of_step,
    exported_results,
    list_exports,
    open_export_file,
    read_export_file,
    remove_crashed_exports,
)
from supervisor.estimator.export.writer import export_program, write_export
from supervisor.estimator.export.base import Exporter, ExportTarget
from supervisor.estimator.metrics import read_eval_events

__all__ = ["Exporter", "ExportTarget", "LatestExporter", "BestExporter", "FinalExporter", "write_export",
           "export_program", "list_exports", "remove_crashed_exports", "open_export_file", "read_export_file",
           "WEIGHTS_FILE", "PROGRAM_FILE", "RESULT_FILE", "SAFETENSORS_FILE"]

logger = logging.getLogger(__name__)


class LatestExporter(Exporter):
    """Exports after every evaluation; keeps the newest ``exports_to_keep``."""

    def __init__(self, name: str = "latest_exporter", exports_to_keep: int | None = 5) -> None:
        super().__init__(name, exports_to_keep)

    def export(self, estimator: ExportTarget, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        return self._export_and_collect(estimator, export_path, checkpoint_path, eval_result)


class FinalExporter(Exporter):
    """Exports once, after the evaluation of the final checkpoint (``is_the_final_export``)."""

    def __init__(self, name: str = "final_exporter") -> None:
        super().__init__(name, exports_to_keep=None)

    def export(self, estimator: ExportTarget, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        self.remove_leftovers(estimator.locate(export_path))
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

    The best so far is what was exported: on its first call in a process it reads its exports'
    records (``eval_result.json``; a damaged record is replaced by the evaluation of that export's
    step in the eval events, the step read from ``model.safetensors``). An evaluation in the
    events that is better than every export — its export was killed, or this exporter is new to
    the run — is exported at that first call from its checkpoint, unless the current evaluation
    is better still; when its checkpoint is gone (retention), a WARNING says so and the bar stays
    what was exported (but an export whose record and step are both unreadable may hold it: then
    it is the bar). So ``best_exporter/`` ends with the best evaluated model still available, and
    never gets a model worse than one it holds (TF's BestExporter forgot its best at a restart).

    Args:
        name: directory name under ``model_dir/export``.
        compare_fn: ``compare_fn(best_eval_result, current_eval_result) -> bool``, True when
            the current result is better (default: lower ``loss``). Exactly these two arguments
            (TF's rule); bind others first, e.g. ``functools.partial(f, threshold=0.1)``.
        exports_to_keep: how many exports to keep (None: all).
        eval_dir: where the evaluations' events are (default: the eval directory of the
            `EvalSpec` it runs with, ``model_dir/eval`` or ``eval_<name>``); read on the first
            call in a process.
    """

    def __init__(self, name: str = "best_exporter", compare_fn: Callable[[Any, Any], bool] | None = None,
                 exports_to_keep: int | None = 5, *, eval_dir: str | os.PathLike | None = None) -> None:
        super().__init__(name, exports_to_keep)
        self._compare_fn = _check_compare_fn(compare_fn)
        self._eval_dir = _check_eval_dir(eval_dir)
        self._default_eval_dir: str | None = None
        self._best: dict[str, Any] | None = None
        self._loaded = False

    def set_default_eval_dir(self, eval_dir: str) -> None:
        """The eval directory to read when none was given (set by `train_and_evaluate`)."""
        self._default_eval_dir = eval_dir

    def export(self, estimator: ExportTarget, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        self.remove_leftovers(estimator.locate(export_path))
        current = dict(eval_result)
        if not self._loaded:
            self._recover(estimator, export_path, current)
            self._loaded = True
        if self._best is not None and not self._compare_fn(self._best, current):
            logger.info("%s: not exporting step %s, not better than the best so far (%s)",
                        self.name, current.get("global_step"), self._best)
            return None
        path = self._export_and_collect(estimator, export_path, checkpoint_path, current)
        self._best = current  # only once exported: the bar is always something exported
        return path

    def _recover(self, estimator: ExportTarget, export_path: str, current: dict[str, Any]) -> None:
        """Sets the best so far after a (re)start, exporting a better evaluation that has none."""
        eval_dir = self._eval_dir or self._default_eval_dir or estimator.eval_dir()
        evaluations = {step: dict(metrics, global_step=step)
                       for step, metrics in read_eval_events(estimator.locate(eval_dir)).items()
                       if step != current.get("global_step")}
        exported, unknown = exported_results(estimator.locate(export_path), evaluations)
        self._best = self._best_of(exported)
        done = {result.get("global_step") for result in exported}
        missing = self._best_of([r for step, r in evaluations.items() if step not in done])
        if missing is None or (self._best is not None and not self._compare_fn(self._best, missing)):
            pass
        elif self._compare_fn(missing, current):
            logger.info("%s: evaluation %s has no export, but the current one is better", self.name, missing)
        else:
            self._export_missing(estimator, export_path, missing, unknown)
        if self._best is not None:
            logger.info("%s: the best evaluation so far is %s", self.name, self._best)

    def _export_missing(self, estimator: ExportTarget, export_path: str, missing: dict[str, Any],
                        unknown: bool) -> None:
        checkpoint = checkpoint_of_step(estimator.locate(estimator.model_dir), missing["global_step"])
        if checkpoint is not None:
            logger.info("%s: exporting the best evaluation so far (%s), which has no export (one killed "
                        "midway, or a new exporter)", self.name, missing)
            try:
                self._export_and_collect(estimator, export_path, checkpoint, missing)
                self._best = missing
                return
            except CheckpointError as e:  # deleted or damaged since: as if gone
                logger.warning("%s: could not export %s: %s", self.name, checkpoint, e)
        logger.warning("%s: the best evaluation so far (%s) has no export and its checkpoint is gone; "
                       "the best exported one is the bar", self.name, missing)
        if unknown:  # an export whose record and step are unreadable may hold it
            self._best = missing

    def _best_of(self, results: list[dict[str, Any]]) -> dict[str, Any] | None:
        best = None
        for result in results:
            if best is None or self._compare_fn(best, result):
                best = result
        return best


def _check_eval_dir(eval_dir: Any) -> str | None:
    if eval_dir is None:
        return None
    if not isinstance(eval_dir, (str, os.PathLike)):
        raise TypeError(f"eval_dir must be the path of an eval directory (str or os.PathLike) or None, got "
                        f"{eval_dir!r}; leave it None for the eval directory of the EvalSpec")
    path = os.fspath(eval_dir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"eval_dir must be a non-empty str path, got {eval_dir!r}")
    return path


_COMPARE_ARGS = ("best_eval_result", "current_eval_result")


def _check_compare_fn(compare_fn: Any) -> Callable[[Any, Any], bool]:
    """TF's rule: the arguments are exactly (best_eval_result, current_eval_result), keywords
    bound by ``functools.partial`` and ``*args``/``**kwargs`` aside."""
    if compare_fn is None:
        return loss_smaller
    if not callable(compare_fn):
        raise TypeError(f"compare_fn must be callable as compare_fn(best_eval_result, current_eval_result), "
                        f"got {compare_fn!r}")
    fix = "define it as def compare_fn(best_eval_result, current_eval_result): ..."
    try:
        parameters = inspect.signature(compare_fn).parameters
    except (TypeError, ValueError) as e:
        raise TypeError(f"compare_fn ({compare_fn!r}) has no signature to check; {fix}") from e
    bound = set(compare_fn.keywords) if isinstance(compare_fn, functools.partial) else set()
    names = [name for name, p in parameters.items()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in bound]
    for required in _COMPARE_ARGS:
        if required not in names:
            raise ValueError(f"compare_fn ({compare_fn!r}) must include {required} argument; {fix}")
    unexpected = [name for name in names if name not in _COMPARE_ARGS]
    if unexpected:
        raise ValueError(f"compare_fn ({compare_fn!r}) has following not expected args: {unexpected}; it is "
                         "called as compare_fn(best_eval_result, current_eval_result): bind the others first, "
                         "e.g. functools.partial(f, threshold=0.1)")
    return compare_fn
