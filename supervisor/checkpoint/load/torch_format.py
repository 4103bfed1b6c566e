"""The ``torch`` checkpoint format (``checkpoint_format="torch"``, the default): the whole state
in one ``torch.save`` file, ``state.pt``; registered in `supervisor.checkpoint.layout.format_registry`."""
from __future__ import annotations

from typing import Any, Callable

from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.formats.serialize import serialize
from supervisor.checkpoint.layout.format import STATE_FILE, Manifest
from supervisor.checkpoint.layout.format_registry import CheckpointFormat, register_format

__all__ = ["TORCH_FORMAT"]


def _read(path: str, manifest: Manifest, copies: dict[str, Any], unpickling: Unpickling) -> tuple[Any, bool]:
    """The payload of the verified private copy of ``state.pt``: views of the copy where it is a
    file torch maps (``mapped``), else tensors of their own."""
    from supervisor.checkpoint.load.loader import load_state_copy  # the loader imports the registry

    copy = copies.pop(STATE_FILE)
    mapped = copy.path is not None
    return load_state_copy(path, manifest, copy, unpickling, mmap=True), mapped


def _write(payload: Any, write_file: Callable[[str, Callable[[Any], None]], None]) -> None:
    """``state.pt``: ``torch.save``'s zip format (`supervisor.checkpoint.formats.serialize`)."""
    write_file(STATE_FILE, lambda writer: serialize(payload, writer))


TORCH_FORMAT = CheckpointFormat(name="torch", marker=STATE_FILE, description="a torch.save checkpoint", read=_read,
                                write=_write)
register_format(TORCH_FORMAT)
