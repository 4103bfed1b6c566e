"""`Exporter`, the base class of the exporters (`supervisor.estimator.exporters`), and
`ExportTarget`, what an exporter needs of the `Estimator` it exports from. Below both the specs
(which check that exporters are `Exporter` instances) and the exporters."""
from __future__ import annotations

import logging
import numbers
import os
import shutil
from typing import Any, Mapping, Protocol

from supervisor.checkpoint.storage import Location, resolve_location
from supervisor.estimator.export.files import list_exports, read_export_record, remove_crashed_exports
from supervisor.estimator.export.objects import delete_object_export
from supervisor.estimator.export.writer import write_export
from supervisor.estimator.locations import options_for

__all__ = ["Exporter", "ExportTarget"]

logger = logging.getLogger(__name__)


class ExportTarget(Protocol):
    """What an `Exporter` uses of an `Estimator`: where it trains (and that object store's
    client options), where evaluations write, the resolved location of a directory of its
    (`locate`: the client built once), and its `export`."""

    @property
    def model_dir(self) -> str: ...

    @property
    def storage_options(self) -> Mapping[str, Any] | None: ...

    def eval_dir(self, name: str | None = None) -> str: ...

    def locate(self, path: str | os.PathLike) -> Location: ...

    def export(self, export_dir_base: str | os.PathLike, checkpoint_path: str | None = None, *,
               eval_result: Mapping[str, Any] | None = None) -> str: ...


class Exporter:
    """Base class: ``export(...)`` is called after each evaluation of `train_and_evaluate`.

    Args:
        name: the exporter's directory name under ``model_dir/export`` (one path component).
        exports_to_keep: how many exports to keep (None: all); older ones are deleted.

    On an ``s3://`` ``model_dir`` the exports go to ``model_dir/export/<name>`` on the same
    object store, with the estimator's client options (``RunConfig(storage_options=...)``):
    an exporter takes no options of its own.
    """

    def __init__(self, name: str, exports_to_keep: int | None = 5) -> None:
        self._name = _check_name(name)
        self._exports_to_keep = _check_exports_to_keep(exports_to_keep)
        self._tidied: set[str] = set()

    @property
    def name(self) -> str:
        return self._name

    #: How an in-loop `EvaluationHook` writes this exporter's exports (the hooks never import
    #: the estimator: they reach its writer through the exporters they are given).
    write_export = staticmethod(write_export)

    @staticmethod
    def exported_steps(export_path: str | os.PathLike | Location) -> set[int]:
        """The global steps of the readable exports under ``export_path`` (a damaged record is
        skipped with a WARNING)."""
        base = resolve_location(export_path)
        records = (read_export_record(Location(path, base.storage)) for _, path in list_exports(base))
        return {record["global_step"] for record in records if record is not None}

    def export(self, estimator: ExportTarget, export_path: str, checkpoint_path: str,
               eval_result: Mapping[str, Any], is_the_final_export: bool) -> str | None:
        """Exports (or not) the evaluated checkpoint; returns the export's path or None."""
        raise NotImplementedError

    def remove_leftovers(self, export_path: str | os.PathLike | Location,
                         storage_options: Mapping[str, Any] | None = None) -> None:
        """`remove_crashed_exports` on the first call for ``export_path`` in this process (each
        export does it again), so a killed export's leftovers go even when nothing is exported.
        ``export_path``: a path or URL (``storage_options``: the client's options for a URL), or
        its resolved `Location` (the estimator's, `ExportTarget.locate`)."""
        if os.fspath(export_path) not in self._tidied:
            remove_crashed_exports(resolve_location(export_path, options_for(export_path, storage_options)))
            self._tidied.add(os.fspath(export_path))

    def _export_and_collect(self, estimator: ExportTarget, export_path: str, checkpoint_path: str,
                            eval_result: Mapping[str, Any]) -> str:
        base = estimator.locate(export_path)
        path = estimator.export(base, checkpoint_path, eval_result=eval_result)
        self._garbage_collect(base)
        return path

    def _garbage_collect(self, base: Location) -> None:
        if self._exports_to_keep is None:
            return
        if base.is_object_store:
            for _, path in list_exports(base)[:-self._exports_to_keep]:
                if delete_object_export(base.storage, path):
                    logger.info("deleted the old export %s (exports_to_keep=%d)", path, self._exports_to_keep)
            return
        export_path = base.path
        for _, path in list_exports(base)[:-self._exports_to_keep]:
            aside = os.path.join(export_path, f".{os.path.basename(path)}.deleting-{os.urandom(8).hex()}")
            os.rename(path, aside)  # atomic: readers never see a half-deleted export
            shutil.rmtree(aside, ignore_errors=True)
            logger.info("deleted the old export %s (exports_to_keep=%d)", path, self._exports_to_keep)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self._name!r})"


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise (ValueError if name == "" else TypeError)(
            f"exporter name must be a non-empty string without {os.sep!r}, got {name!r}")
    if name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise ValueError(f"exporter name must be a single directory name under model_dir/export (no '/', not "
                         f"'.' or '..'), got {name!r}; e.g. 'best_exporter'")
    return name


def _check_exports_to_keep(value: Any) -> int | None:
    if value is None:
        return None
    is_number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not (is_number and isinstance(value, numbers.Integral) and value > 0):
        raise (ValueError if is_number else TypeError)(
            f"`exports_to_keep`, if provided, must be a positive integer (or None to keep every export), "
            f"got {value!r}")
    return int(value)
