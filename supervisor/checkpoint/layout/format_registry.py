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
module calling `register_format` (docs/development.md: "A new checkpoint format").
"""
from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["BUILTIN_FORMATS", "CheckpointFormat", "LazyVariable", "format_in", "format_named", "format_of", "formats", "markers",
           "register_format", "writable_format"]

#: The modules of the built-in formats, imported (and so registered) on the first question.
BUILTIN_FORMATS = ("supervisor.checkpoint.load.torch_format", "supervisor.checkpoint.load.dcp_format",
                   "supervisor.checkpoint.load.safetensors_format")


@dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format.

    Attributes:
        name: its ``checkpoint_format=`` value (``"torch"``, ``"dcp"``).
        marker: the file a checkpoint of this format always holds (and its manifest lists).
        description: how messages name it (``"a sharded torch.distributed.checkpoint"``).
        read: ``read(path, manifest, copies, trusted_globals, map_location) -> (payload, mapped)``:
            the whole state of a verified checkpoint, from the private copies of its files
            (name -> `supervisor.checkpoint.load.private_copy.PrivateCopy`; it pops those it keeps).
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

    def read_files(self, path: str, files: Any, trusted_globals: Iterable[Any], map_location: Any) -> tuple[Any, bool]:
        """``read`` of a checkpoint's verified private copies (``files``, closed after)."""
        try:
            return self.read(path, files.manifest, files.copies, trusted_globals, map_location)
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
_LOADING = False
#: Held while the built-ins load: another thread's first question waits for all of them.
_LOAD_LOCK = threading.RLock()


def register_format(fmt: CheckpointFormat) -> None:
    """Adds ``fmt`` (a name or a marker already registered by another format is a `ValueError`)."""
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
    """The format ``name`` (``checkpoint_format=``); `ValueError` naming the known ones."""
    for fmt in formats():
        if fmt.name == name:
            return fmt
    raise ValueError(f"checkpoint_format={name!r} is not a checkpoint format (known: "
                     f"{', '.join(repr(f.name) for f in formats())})")


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
    """The format of a checkpoint whose manifest lists ``files``; None when it lists no marker."""
    listed = set(files)
    return next((fmt for fmt in formats() if fmt.marker in listed), None)


def format_in(path: str) -> CheckpointFormat | None:
    """The format of the local checkpoint directory ``path``, from the marker files it holds
    (links not followed; whether it verifies is verification's question)."""
    return format_of(name for name in markers() if os.path.lexists(os.path.join(path, name)))


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
