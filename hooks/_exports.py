"""The exporters of an `EvaluationHook` (``exporters=[BestExporter(), ...]``): called after each
evaluation with the arguments ``train_and_evaluate`` gives them, on the model just evaluated.

What is exported is the live model of the evaluated step, copied at once (an evaluation runs in
``after_run``, before anything trains on): the ``checkpoint_path`` the exporters get is the path
of that step's checkpoint (``<logdir>/model.ckpt-N``, which exists when the schedule saved at
that step), and `LoopExportTarget` hands the live copy for it. A path of another step (the
`BestExporter` exporting a better evaluation that a killed run left without an export) is read
from its checkpoint, verified, into a copy of the model. The exports land in
``<logdir>/export/<exporter name>``, written atomically by the exporters' writer (a temp
directory renamed into place), as under ``train_and_evaluate``.

After a kill: the resumed run replays the steps after its checkpoint bit-exactly and evaluates
them again; an exporter that already holds an export of the step (the killed run's, of the same
weights) is not called for it again, so no export is lost or doubled, and the `BestExporter`
reads its best back from its exports' records as under ``train_and_evaluate``.

The exporters live in `supervisor.estimator`, which the hooks never import: the exporters given
bring their writer and their record reader (`Exporter.write_export`, `Exporter.exported_steps`).
"""
from __future__ import annotations

import copy
import logging
import os
from typing import Any, Iterable, Mapping

import torch

from supervisor.checkpoint import STEP_KEY, checkpoint_name, read_checkpoint
from supervisor.checkpoint.storage import LocalStorage, Location
from supervisor.clock import Clock
from supervisor.state import strip_wrapper_prefixes, unwrap_module

__all__ = ["LoopExportTarget", "LoopExporters", "check_exporters"]

logger = logging.getLogger(__name__)

_EXPORTER_METHODS = ("export", "name", "write_export", "exported_steps")
_LOCAL = LocalStorage()


def check_exporters(exporters: Any) -> list[Any]:
    """``exporters``: a list of exporters (``export(...)`` and ``name``, e.g. `BestExporter`)."""
    if exporters is None:
        return []
    if not isinstance(exporters, Iterable) or isinstance(exporters, (str, bytes)):
        raise TypeError(f"EvaluationHook's exporters must be a list of exporters (BestExporter, LatestExporter, "
                        f"FinalExporter from supervisor.estimator), got {exporters!r}")
    checked = list(exporters)
    for exporter in checked:
        if not all(hasattr(exporter, m) for m in _EXPORTER_METHODS) or not callable(exporter.export):
            raise TypeError(f"EvaluationHook's exporters must be exporters (subclasses of "
                            f"supervisor.estimator.Exporter, e.g. BestExporter()), got {exporter!r}")
    names = [exporter.name for exporter in checked]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"EvaluationHook's exporters must have distinct names (each exports into "
                         f"<logdir>/export/<name>); {twice} is used twice: pass name=... to one of them")
    return checked


class LoopExportTarget:
    """The `ExportTarget` (what an exporter uses of an `Estimator`) of an in-loop evaluation."""

    def __init__(self, logdir: str, eval_dir: str, model: torch.nn.Module, state_key: str | None,
                 basename: str, clock: Clock) -> None:
        self._logdir, self._eval_dir, self._model = logdir, eval_dir, model
        self._state_key, self._basename, self.clock = state_key, basename, clock
        self.example_input = None  # no torch.export program from the loop
        self._live: tuple[str, int] | None = None
        self.writer: Any = None  # the exporters' `write_export` (set by `LoopExporters`)

    @property
    def model_dir(self) -> str:
        return self._logdir

    @property
    def storage_options(self) -> Mapping[str, Any] | None:
        return None  # a local logdir (an object-store one is refused at the session's start)

    def eval_dir(self, name: str | None = None) -> str:
        return self._eval_dir

    def locate(self, path: str | os.PathLike) -> Location:
        """The local `Location` of ``path`` (the logdir is local)."""
        return path if isinstance(path, Location) else Location(os.fspath(path), _LOCAL)

    def checkpoint_path(self, step: int) -> str:
        return os.path.join(self._logdir, checkpoint_name(self._basename, step))

    def evaluated(self, step: int) -> str:
        """The live model is the one evaluated at ``step``; returns the path standing for it."""
        self._live = (self.checkpoint_path(step), step)
        return self._live[0]

    def export(self, export_dir_base: str | os.PathLike, checkpoint_path: str | None = None, *,
               eval_result: Mapping[str, Any] | None = None) -> str:
        if checkpoint_path is None:
            raise ValueError("an in-loop export needs the checkpoint_path of the step it exports")
        return self.writer(self, export_dir_base, os.fspath(checkpoint_path), eval_result)

    def load_model_copy(self, checkpoint: str) -> tuple[torch.nn.Module, int]:
        """A copy of the model in eval mode: the live one for the step just evaluated, else the
        weights of the checkpoint at ``checkpoint`` (read and verified); and its step."""
        with torch.no_grad():
            model = copy.deepcopy(self._model)
        model.eval()
        if self._live is not None and os.fspath(checkpoint) == self._live[0]:
            return model, self._live[1]
        read = read_checkpoint(checkpoint)
        entry = read.payload.get(self._state_key) if self._state_key is not None else None
        if not isinstance(entry, Mapping):
            raise ValueError(f"{checkpoint} has no entry for the evaluated model (state key {self._state_key!r}); "
                             "put the evaluated model in the session's state to export older checkpoints")
        model.load_state_dict(strip_wrapper_prefixes(entry, model.state_dict().keys()))
        return model, int(read.payload[STEP_KEY])


class LoopExporters:
    """Runs the exporters after each evaluation (see the module)."""

    def __init__(self, exporters: list[Any], target: LoopExportTarget) -> None:
        self._exporters, self._target = exporters, target
        self._done: dict[str, int] = {}  # exporter name -> the step it holds an export of
        if exporters:
            target.writer = exporters[0].write_export
        for exporter in exporters:
            if hasattr(exporter, "set_default_eval_dir"):
                exporter.set_default_eval_dir(target.eval_dir())

    def export(self, metrics: Mapping[str, Any], step: int, *, final: bool, only_pending: bool = False) -> list[Any]:
        """Offers the evaluation of ``step`` (the live model) to the exporters; ``only_pending``:
        to those holding no export of it. Returns their results (None: not exported)."""
        path = self._target.evaluated(step)
        results = []
        for exporter in self._exporters:
            if only_pending and self._done.get(exporter.name) == step:
                continue
            base = os.path.join(self._target.model_dir, "export", exporter.name)
            result = None
            if step in exporter.exported_steps(base):
                logger.info("%s holds an export of step %d already (made before a restart); not exporting "
                            "it again", exporter.name, step)
                self._done[exporter.name] = step
            else:
                result = exporter.export(self._target, base, path, dict(metrics, global_step=step), final)
                if result is not None:  # one that declined may still get the final offer
                    self._done[exporter.name] = step
            results.append(result)
        return results



def model_key(state: Mapping[str, Any], model: torch.nn.Module) -> str | None:
    """The name the evaluated ``model`` has in the session's state (None: not in it)."""
    for key, value in state.items():
        if isinstance(value, torch.nn.Module) and unwrap_module(value) is model:
            return key
    return None
