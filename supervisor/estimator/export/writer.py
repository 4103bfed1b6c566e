"""Writing one export directory (the layout: `supervisor.estimator.exporters`).

Locally the files go into a hidden temporary sibling, are fsynced, and the directory is renamed
into place. On an object store (``export_dir_base`` an ``s3://`` URL) the files are written into
a local temporary directory (``tempfile``: ``$TMPDIR``), uploaded to ``<base>/<version>/``, and
the version's manifest is written last, create-only (`supervisor.estimator.export.objects`).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from typing import Any, Callable, Mapping, Protocol

import torch

from supervisor.checkpoint import fsync_dir
from supervisor.checkpoint.storage import Location, resolve_location
from supervisor.clock import Clock
from supervisor.estimator.export.files import (
    PROGRAM_FILE,
    RESULT_FILE,
    SAFETENSORS_FILE,
    WEIGHTS_FILE,
    new_version_dir,
    next_version,
    remove_crashed_exports,
)
from supervisor.estimator.export.objects import remove_object_leftovers, upload_export
from supervisor.estimator.isolation import preserved_rng

__all__ = ["ExportSource", "write_export", "export_program"]

logger = logging.getLogger(__name__)


class ExportSource(Protocol):
    """What `write_export` needs of an `Estimator`."""

    @property
    def clock(self) -> Clock: ...

    @property
    def example_input(self) -> Any: ...

    def load_model_copy(self, checkpoint: str) -> tuple[torch.nn.Module, int]: ...


def write_export(estimator: ExportSource, export_dir_base: str | os.PathLike | Location, checkpoint_path: str,
                 eval_result: Mapping[str, Any] | None) -> str:
    """Exports ``checkpoint_path`` into a new ``<export_dir_base>/<timestamp>/``; returns it.
    ``estimator`` gives the model copy with the checkpoint's weights, the example input and the
    clock (the export's version); the process's RNG states are restored afterwards.
    ``export_dir_base`` may be on an object store (a `Location` resolved with its client's
    options, or a URL ``s3://bucket/prefix`` for the default client): the export then exists once
    its manifest is written, last.

    Raises:
        ValueError: an unknown URL scheme.
        ImportError: an ``s3://`` base without the ``[s3]`` extra.
    """
    base = resolve_location(export_dir_base)
    if base.is_object_store:
        return _write_to_store(estimator, base, checkpoint_path, eval_result)
    export_dir_base = base.path
    os.makedirs(export_dir_base, exist_ok=True)
    remove_crashed_exports(base)
    final = new_version_dir(base, int(estimator.clock.time()))
    tmp = os.path.join(export_dir_base, f".{os.path.basename(final)}.tmp-{socket.gethostname()}-{os.getpid()}-"
                                        f"{os.urandom(8).hex()}")
    os.makedirs(tmp)
    try:
        step = _write_files(estimator, tmp, checkpoint_path, eval_result)
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(export_dir_base)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("exported the checkpoint of step %d to %s", step, final)
    return final


def _write_to_store(estimator: ExportSource, base: Location, checkpoint_path: str,
                    eval_result: Mapping[str, Any] | None) -> str:
    storage = base.storage
    _, exports = remove_object_leftovers(storage, base.path, abort_uploads=False)  # the exporters' first call aborts
    version = next_version(int(estimator.clock.time()), exports)
    with tempfile.TemporaryDirectory(prefix="supervisor-export-") as local:
        step = _write_files(estimator, local, checkpoint_path, eval_result)
        final = upload_export(storage, local, base.path, version)
    logger.info("exported the checkpoint of step %d to %s", step, final)
    return final


def _write_files(estimator: ExportSource, directory: str, checkpoint_path: str,
                 eval_result: Mapping[str, Any] | None) -> int:
    """Writes the export's files into the existing local ``directory``; returns the step."""
    with preserved_rng():
        model, step = estimator.load_model_copy(checkpoint_path)
        _save_file(os.path.join(directory, WEIGHTS_FILE), lambda f: torch.save(model.state_dict(), f))
        _save_safetensors(model, os.path.join(directory, SAFETENSORS_FILE), step,
                          mode=stat.S_IMODE(os.stat(os.path.join(directory, WEIGHTS_FILE)).st_mode))
        if estimator.example_input is not None:
            program = export_program(model, estimator.example_input)
            _save_file(os.path.join(directory, PROGRAM_FILE), lambda f: torch.export.save(program, f))
    record = {"global_step": step, "checkpoint_path": checkpoint_path,
              "metrics": {k: v for k, v in (eval_result or {}).items() if k != "global_step"}}
    _save_file(os.path.join(directory, RESULT_FILE), lambda f: f.write(json.dumps(record, indent=2).encode()))
    return step


def export_program(model: torch.nn.Module, example_input: Any) -> Any:
    """``torch.export`` of ``model`` on ``example_input`` (a tensor or a tuple of positional
    arguments), with the first dimension of every tensor argument dynamic where the model allows
    it (``Dim.AUTO``), so the program accepts other batch sizes than the example's."""
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    dynamic = tuple({0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) and a.dim() > 0 else None
                    for a in args)
    return torch.export.export(model, args, dynamic_shapes=dynamic)


def _save_safetensors(model: torch.nn.Module, path: str, step: int, *, mode: int | None = None) -> None:
    """``model.safetensors`` when the package is installed (else nothing), fsynced; ``mode``: the
    file's permission bits (safetensors itself creates files 0600, unlike every other file of an
    export)."""
    try:  # an optional extra: torch-supervisor[safetensors]
        from safetensors.torch import save_model
    except ImportError:
        return
    save_model(model, path, metadata={"global_step": str(step)})
    if mode is not None:
        os.chmod(path, mode)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _save_file(path: str, fill: Callable[[Any], Any]) -> None:
    with open(path, "xb") as f:
        fill(f)
        f.flush()
        os.fsync(f.fileno())
