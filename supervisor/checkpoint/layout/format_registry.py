"""The checkpoint format registry: which format a checkpoint has, decided in one place.

A committed checkpoint's ``MANIFEST.json`` lists its files; each format names the one file that
marks it (its ``marker``: ``state.pt`` for ``checkpoint_format="torch"``, ``.metadata`` for
``"dcp"``), and `format_of` answers from the manifest's list (the first registered format whose
marker is listed: ``torch`` before ``dcp``, so a checkpoint holding both loads as ``torch``, as it
always did). `format_in` answers from the files of a local directory instead (a checkpoint whose
manifest is not read yet). The loader, the reader, `load_checkpoint`, verification and the CLI
ask here; none of them names a format's files.

Each format is one module that registers itself (`supervisor.checkpoint.load.torch_format`,
`supervisor.checkpoint.load.dcp_format`, imported on the first question); a new format is one more
module calling `register_format` (docs/development.md: "A new checkpoint format"). A format of
another package is declared in the entry-point group ``torch_supervisor.checkpoint_formats``
(`ENTRY_POINT_GROUP`), which every process — the CLI, a sidecar evaluator — reads the first time
it meets a format name or a checkpoint no registered format marks.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["BUILTIN_FORMATS", "ENTRY_POINT_GROUP", "CheckpointFormat", "LazyVariable", "format_in", "format_named",
           "format_of", "formats", "markers", "register_format", "unmarked", "writable_format"]

logger = logging.getLogger(__name__)

#: The modules of the built-in formats, imported (and so registered) on the first question.
BUILTIN_FORMATS = ("supervisor.checkpoint.load.torch_format", "supervisor.checkpoint.load.dcp_format",
                   "supervisor.checkpoint.load.safetensors_format")
ENTRY_POINT_GROUP = "torch_supervisor.checkpoint_formats"
"""The entry-point group other packages declare checkpoint formats in, read by every process
(the CLI, a sidecar evaluator) the first time it meets a format name or a checkpoint that no
registered format marks. An entry is ``<name> = "module:FORMAT"`` (a `CheckpointFormat`,
registered when loaded) or ``<name> = "module"`` (a module that calls `register_format` when
imported); ``<name>`` is the format's ``checkpoint_format=`` value::

    [project.entry-points."torch_supervisor.checkpoint_formats"]
    jsonweights = "json_weights:FORMAT"
"""
_HOW_TO_REGISTER = (f"register one with supervisor.checkpoint.layout.format_registry.register_format("
                    f"CheckpointFormat(...)) in this process or, so that every process (the CLI, a sidecar) finds "
                    f"it, as an entry point of your package in the group {ENTRY_POINT_GROUP!r}")


@dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format.

    Attributes:
        name: its ``checkpoint_format=`` value (``"torch"``, ``"dcp"``).
        marker: the file a checkpoint of this format always holds (and its manifest lists).
        description: how messages name it (``"a sharded torch.distributed.checkpoint"``).
        read: ``read(path, manifest, copies, unpickling) -> (payload, mapped)``: the whole state
            of a verified checkpoint, from the private copies of its files (name ->
            `supervisor.checkpoint.load.private_copy.PrivateCopy`; it pops those it keeps);
            ``unpickling``: the reader's `supervisor.checkpoint.formats.safe_globals.Unpickling`
            (its ``map_location``; its ``load`` for a ``torch.save`` file: the allow-list applied).
        single_file: its state is the one ``marker`` file, restorable by the single-file restore
            (`supervisor.checkpoint.load.loader.load_verified`); otherwise ``restore_hint`` says how.
        restore_hint: what a single-file restore of it tells the user to call instead.
        variables: ``variables(path, storage) -> {name: entry}`` for `CheckpointReader` where its
            variables are not read from the ``marker`` file as ``torch.save``'s (None: they are).
        write: ``write(payload, write_file)``: writes a checkpoint of this format for
            ``CheckpointManager(checkpoint_format=name)``; ``write_file(name, fill)`` adds the
            file ``name`` to the checkpoint, ``fill(writer)`` writing its bytes (checksummed and
            listed in the manifest by the commit). None: the manager cannot write it (``dcp``:
            the sharded manager writes it).
        torch_file: the ``marker`` is a ``torch.save`` file the single-file restore loads itself
            (mapped, shared with the other ranks); False: the restore calls ``read``.
    """

    name: str
    marker: str
    description: str
    read: Callable[..., tuple[Any, bool]]
    single_file: bool = True
    restore_hint: str = ""
    variables: Callable[[str, Any], Mapping[str, Any]] | None = None
    write: Callable[[Any, Callable[[str, Callable[[Any], None]], None]], None] | None = None
    torch_file: bool = True

    def read_files(self, path: str, files: Any, unpickling: Any) -> tuple[Any, bool]:
        """``read`` of a checkpoint's verified private copies (``files``, closed after)."""
        try:
            return self.read(path, files.manifest, files.copies, unpickling)
        finally:
            files.close()


class LazyVariable:
    """A variable `CheckpointReader` lists from a format's ``variables`` (its ``shape`` and
    ``dtype`` known, its tensor read on demand by ``load(path, storage)``)."""

    shape: tuple[int, ...]
    dtype: Any

    def load(self, path: str, storage: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.load")


_FORMATS: dict[str, CheckpointFormat] = {}
_LOADED = False
_DISCOVERED = False
_LOADING = False
#: Held while the built-ins load (and while the entry points are read): another thread's first
#: question waits for all of them.
_LOAD_LOCK = threading.RLock()


def register_format(fmt: CheckpointFormat) -> None:
    """Adds ``fmt`` to this process's registry: ``checkpoint_format=fmt.name`` is then accepted by
    every front door and `CheckpointManager` (when ``fmt.write`` is set), and a checkpoint whose
    manifest lists ``fmt.marker`` is read with ``fmt.read``. A marker already registered by
    another format is a `ValueError`. Other processes (the CLI, a sidecar) know the format when it
    is declared in `ENTRY_POINT_GROUP` (or listed in `BUILTIN_FORMATS`)."""
    if not isinstance(fmt, CheckpointFormat):
        raise TypeError(f"register_format takes a CheckpointFormat, got {fmt!r}")
    for other in _FORMATS.values():
        if other.name != fmt.name and other.marker == fmt.marker:
            raise ValueError(f"the checkpoint format {fmt.name!r} names the marker file {fmt.marker!r}, which marks "
                             f"the format {other.name!r} already; choose a file of its own")
    _FORMATS[fmt.name] = fmt


def formats() -> tuple[CheckpointFormat, ...]:
    """Every registered format, in registration order (the built-in ones first)."""
    if not _LOADED:
        _load_builtin()
    return tuple(_FORMATS.values())


def markers() -> tuple[str, ...]:
    """The marker files of every format (``("state.pt", ".metadata")``)."""
    return tuple(f.marker for f in formats())


def format_named(name: str) -> CheckpointFormat:
    """The format ``name`` (``checkpoint_format=``; the entry-point group is read when it is not
    registered yet); `ValueError` naming the registered ones and how to register one."""
    found = _named(name) or (_discover() and _named(name))
    if found:
        return found
    raise ValueError(f"checkpoint_format={name!r} is not a checkpoint format (registered: "
                     f"{', '.join(repr(f.name) for f in formats())}); {_HOW_TO_REGISTER}")


def _named(name: str) -> CheckpointFormat | None:
    return next((fmt for fmt in formats() if fmt.name == name), None)


def writable_format(name: str) -> CheckpointFormat:
    """The format ``name`` for ``CheckpointManager(checkpoint_format=)``: a `ValueError` names the
    known formats, or says which writes a format the manager cannot (``dcp``)."""
    fmt = format_named(name)
    if fmt.write is None:
        writable = ", ".join(repr(f.name) for f in formats() if f.write is not None)
        raise ValueError(f"checkpoint_format={name!r}: CheckpointManager cannot write {fmt.description} "
                         f"({fmt.restore_hint or 'its own writer does'}); it writes {writable}")
    return fmt


def format_of(files: Iterable[str]) -> CheckpointFormat | None:
    """The format of a checkpoint whose manifest lists ``files``; None when it lists no marker
    (of a registered format, or of one the entry-point group declares)."""
    listed = set(files)
    def find() -> CheckpointFormat | None:
        return next((fmt for fmt in formats() if fmt.marker in listed), None)
    return find() or (_discover() and find()) or None


def unmarked(files: Iterable[str]) -> str:
    """What a manifest listing ``files`` but no registered format's marker lacks (the message of
    the `CheckpointCorruptError` that refuses it): the markers and formats known, and how a
    format of another package becomes known."""
    listed = sorted(set(files) - {"MANIFEST.json"})
    shown = ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
    return (f"lists neither {' nor '.join(markers())} (the files of the registered checkpoint formats "
            f"{', '.join(repr(f.name) for f in formats())}) but {shown or 'no file'}: a checkpoint of another format "
            f"is read once the package providing it is installed (entry-point group {ENTRY_POINT_GROUP!r})")


def format_in(path: str) -> CheckpointFormat | None:
    """The format of the local checkpoint directory ``path``, from the marker files it holds
    (links not followed; whether it verifies is verification's question)."""
    def find() -> CheckpointFormat | None:
        return format_of(name for name in markers() if os.path.lexists(os.path.join(path, name)))
    return find() or (_discover() and find()) or None


def _load_builtin() -> None:
    global _LOADED, _LOADING
    with _LOAD_LOCK:
        if _LOADED or _LOADING:  # another thread loaded them meanwhile, or a built-in's import asks
            return
        _LOADING = True
        try:
            for module in BUILTIN_FORMATS:
                importlib.import_module(module)
        finally:
            _LOADING = False
        _LOADED = True


def _discover() -> bool:
    """Registers the formats the entry-point group `ENTRY_POINT_GROUP` declares (once per
    process, at the first name or checkpoint no registered format answers); True if it ran now.
    An entry point that fails to load is logged (WARNING, naming it) and skipped."""
    global _DISCOVERED
    with _LOAD_LOCK:
        if _DISCOVERED:
            return False
        _DISCOVERED = True
        formats()
        _register_entry_points()
    return True


def _register_entry_points() -> None:
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = ep.load()
            if isinstance(loaded, CheckpointFormat) and _FORMATS.get(loaded.name) is not loaded:
                register_format(loaded)
        except Exception as e:  # one broken package must not hide the others' formats
            logger.warning("the checkpoint format entry point %s = %s (group %s) failed to load: %s: %s",
                           ep.name, ep.value, ENTRY_POINT_GROUP, type(e).__name__, e)
            continue
        if ep.name not in _FORMATS:
            logger.warning("the entry point %s = %s (group %s) registered no checkpoint format named %r",
                           ep.name, ep.value, ENTRY_POINT_GROUP, ep.name)
