"""Public helpers over a checkpoint directory (SPEC §4, §5.8).

``latest_checkpoint`` and ``get_checkpoint_state`` (index.py) mirror TensorFlow; this module adds
`load_checkpoint` (the saved mapping, verified), `restore_partial` (warm start: the matching keys
of a checkpoint's ``"model"`` into a module) and `checkpoints_iterator` (TF's, yielding verified
checkpoints only).
"""
from __future__ import annotations

import fnmatch
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from supervisor.checkpoint.layout.format import MANIFEST_FILE, META_KEY
from supervisor.checkpoint.layout.format_registry import format_in
from supervisor.checkpoint.layout.index import latest_checkpoint
from supervisor.checkpoint.load.loader import is_remote, load_verified, read_unpickled, resolve_storage, verify_checkpoint
from supervisor.checkpoint.formats.memory_file import MemoryFile
from supervisor.checkpoint.formats.safe_globals import Unpickling
from supervisor.checkpoint.storage import Storage, is_url
from supervisor.checkpoint.layout.verify import check_verify
from supervisor.clock import Clock, resolve_clock
from supervisor._validate import check_watched_directory
from supervisor._validate import check_callable, check_number
from supervisor.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointVanishedError,
)
from supervisor.state import strip_wrapper_prefixes, unwrap_module

__all__ = ["load_checkpoint", "restore_partial", "PartialRestoreReport", "checkpoints_iterator"]

logger = logging.getLogger(__name__)


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu", *, verify: str = "full",
                    trusted_globals: Iterable[Any] = (), storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Returns the mapping a checkpoint holds (``global_step``, ``rng``, one entry per state name).

    ``path`` is a checkpoint directory (verified first, ``verify="full"`` or ``"size"``) or a
    single file saved with ``torch.save`` (loaded as is, e.g. a pre-trained model's state dict).
    Loading is always ``weights_only``; ``trusted_globals`` allowlists extra classes/functions.

    A sharded checkpoint (``checkpoint_format="dcp"``) comes back in the same shape, every
    tensor whole (all ranks' shards reassembled, read once and verified), its optimizer state
    keyed by parameter name as DCP saves it, on the CPU or the device ``map_location`` names.

    ``path`` may be an ``s3://bucket/prefix/model.ckpt-N`` URL (``storage_options``: the
    client's options): read once by ranged reads, verified the same way.

    Raises:
        ValueError: ``verify`` is not ``"full"`` or ``"size"``.
        CheckpointNotFoundError: nothing at ``path``.
        CheckpointVanishedError: the checkpoint was deleted while being read (retention made
            room for a newer one): not damage; read `latest_checkpoint` again.
        CheckpointCorruptError: the checkpoint fails verification or cannot be loaded.
        CheckpointError: it needs a global that is not trusted.
    """
    verify = check_verify(verify)
    unpickling = Unpickling(trusted_globals, map_location)  # this read's allow-list, resolved once
    storage, path = resolve_storage(path, storage_options=storage_options)
    if is_remote(storage):
        return _load_remote(storage, path, verify, unpickling)
    if os.path.isdir(path):
        if (fmt := format_in(path)) is None or fmt.single_file:
            return load_verified(path, verify=verify, unpickling=unpickling, storage=storage).payload
        return read_unpickled(storage, path, verify=verify, unpickling=unpickling).payload  # sharded
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(f"no checkpoint at {path}")
    try:
        return unpickling.load(path)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise CheckpointCorruptError(f"{path} cannot be loaded ({type(e).__name__}: {e})") from e


def _load_remote(storage: Storage, path: str, verify: str, unpickling: Unpickling) -> dict[str, Any]:
    """`load_checkpoint` of an object-store URL: a checkpoint prefix (its manifest exists) through
    the verified loader, else a single object written by ``torch.save``."""
    if storage.exists(storage.join(path, MANIFEST_FILE)):
        return read_unpickled(storage, path, verify=verify, unpickling=unpickling).payload
    try:
        data = bytearray(storage.read_bytes(path))
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointNotFoundError(f"no checkpoint at {path} (no object, no prefix with a {MANIFEST_FILE})") from None
    try:
        with MemoryFile(data, path) as f:
            return unpickling.load(f)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise CheckpointCorruptError(f"{path} cannot be loaded ({type(e).__name__}: {e})") from e


@dataclass(frozen=True)
class PartialRestoreReport:
    """What `restore_partial` did.

    Attributes:
        loaded: the target's keys that were loaded from the checkpoint.
        skipped: checkpoint keys not loaded, each with the reason.
        missing: the target's keys the checkpoint does not provide (left as they were).
    """

    loaded: tuple[str, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [f"loaded {len(self.loaded)} key(s), skipped {len(self.skipped)}, "
                 f"{len(self.missing)} missing from the checkpoint"]
        lines += [f"  skipped {k}: {why}" for k, why in self.skipped.items()]
        lines += [f"  missing {k}" for k in self.missing]
        return "\n".join(lines)


def restore_partial(checkpoint_path: str | os.PathLike, target: torch.nn.Module,
                    include: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
                    strict: bool = False, *, entry: str = "model", trusted_globals: Iterable[Any] = (),
                    storage_options: Mapping[str, Any] | None = None) -> PartialRestoreReport:
    """Loads the matching keys of a checkpoint's ``entry`` (default ``"model"``) into ``target``.

    Meant for ``init_fn`` (warm start). A key is loaded when it matches ``include`` (glob
    patterns such as ``"encoder.*"``; None: every key), does not match ``exclude``, exists in the
    target and has the same shape; others are skipped with the reason. Wrapper prefixes
    (``module.``, ``_orig_mod.``) are reconciled on both sides.

    Example::

        def init_fn(session):
            report = restore_partial("pretrained/model.ckpt-9000", session.state["model"],
                                     exclude="head.*")
            logging.info("warm start: %s", report)

    Args:
        strict: raise instead of skipping when a selected key is missing from the target or has
            another shape (nothing is loaded then). ``storage_options``: for a URL checkpoint.

    Raises:
        CheckpointError: the entry does not exist; or ``strict`` and keys did not fit.
    """
    module = unwrap_module(target)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"target must be a torch.nn.Module, got {type(target).__name__}")
    payload = load_checkpoint(checkpoint_path, trusted_globals=trusted_globals, storage_options=storage_options)
    source = _entry(payload, entry, checkpoint_path)
    own = module.state_dict()
    source = strip_wrapper_prefixes(source, own.keys())
    selected, skipped = _select(source, own, _patterns("include", include), _patterns("exclude", exclude))
    misfits = {k: why for k, why in skipped.items() if not why.endswith("include") and "exclude" not in why}
    if strict and misfits:
        raise CheckpointError(f"restore_partial(strict=True) from {os.fspath(checkpoint_path)}: keys do not "
                              f"fit the target: {misfits}; nothing was loaded")
    module.load_state_dict(selected, strict=False)
    missing = tuple(k for k in own if k not in selected and k not in source)
    return PartialRestoreReport(tuple(selected), skipped, missing)


def _select(source: Mapping[str, Any], own: Mapping[str, Any], includes: Any,
            excludes: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The entries of ``source`` that `restore_partial` loads, and why each other one is skipped."""
    selected: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for key, value in source.items():
        if includes is not None and not _matches(key, includes):
            skipped[key] = "not matched by include"
        elif excludes and _matches(key, excludes):
            skipped[key] = "matched by exclude"
        elif key not in own:
            skipped[key] = "not in the target"
        elif isinstance(value, torch.Tensor) and tuple(value.shape) != tuple(own[key].shape):
            skipped[key] = f"shape {tuple(value.shape)} in the checkpoint, {tuple(own[key].shape)} in the target"
        else:
            selected[key] = value
    return selected, skipped


def _entry(payload: Any, entry: str, path: Any) -> Mapping[str, Any]:
    if isinstance(payload, Mapping) and entry in payload and isinstance(payload[entry], Mapping):
        return payload[entry]
    if isinstance(payload, Mapping) and META_KEY not in payload and payload \
            and all(isinstance(v, torch.Tensor) for v in payload.values()):
        return payload  # a bare state dict saved with torch.save(model.state_dict(), path)
    names = [k for k in payload if k != META_KEY] if isinstance(payload, Mapping) else []
    raise CheckpointError(f"{os.fspath(path)} has no entry {entry!r}; it has {names}; pass entry=<one of them>")


def _patterns(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    value = tuple(value)
    if not all(isinstance(p, str) for p in value):
        raise TypeError(f"{name} must be a glob pattern or a list of them such as ['encoder.*'], got {value!r}")
    return value


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def checkpoints_iterator(checkpoint_dir: str | os.PathLike, min_interval_secs: float = 0,
                         timeout: float | None = None, timeout_fn: Callable[[], bool] | None = None, *,
                         verify: str = "full", poll_secs: float = 1.0, clock: Clock | None = None,
                         storage_options: Mapping[str, Any] | None = None) -> Iterator[str]:
    """Yields each new checkpoint path as it appears (TF's ``checkpoints_iterator``).

    Waits for the index to name a checkpoint other than the last one yielded, checking every
    ``poll_secs``; yields it only once it verifies (a checkpoint that fails is reported once and
    waited past; one that retention deletes while it is verified is passed over silently, the
    index already names a newer one). At most one checkpoint per ``min_interval_secs``. When
    ``timeout`` seconds pass without a new checkpoint: stop, unless ``timeout_fn()`` returns
    False (then keep waiting). Arguments are checked at the call, before iteration starts.

    ``checkpoint_dir`` may be an ``s3://bucket/prefix`` URL (``storage_options``: the client's
    options); the checkpoints are then yielded as URLs, verified through the object store.
    """
    if not is_url(checkpoint_dir):
        check_watched_directory("checkpoint_dir", checkpoint_dir)
    check_number("min_interval_secs", min_interval_secs, minimum=0)
    check_number("timeout", timeout, minimum=0, allow_none=True)
    check_callable("timeout_fn", timeout_fn, signature="timeout_fn() -> bool")
    check_number("poll_secs", poll_secs, strictly_positive=True)
    watched = _Watched(*resolve_storage(checkpoint_dir, storage_options=storage_options))
    return _iterate(watched, float(min_interval_secs), timeout, timeout_fn,
                    check_verify(verify), float(poll_secs), resolve_clock(clock))


@dataclass(frozen=True)
class _Watched:
    """The directory `checkpoints_iterator` watches, with its storage."""

    storage: Storage
    directory: str


def _iterate(watched: _Watched, min_interval_secs: float, timeout: float | None,
             timeout_fn: Callable[[], bool] | None, verify: str, poll_secs: float, clock: Clock) -> Iterator[str]:
    last: str | None = None
    rejected: set[str] = set()
    while True:
        path = _wait_for_new(watched, last, timeout, poll_secs, clock, verify, rejected)
        if path is None:
            if timeout_fn is None:
                logger.info("timed out waiting for a new checkpoint in %s", watched.directory)
                return
            if timeout_fn():
                return
            continue
        start = clock.monotonic()
        last = path
        yield path
        remaining = start + min_interval_secs - clock.monotonic()
        if remaining > 0:
            clock.sleep(remaining)


def _wait_for_new(watched: _Watched, last: str | None, timeout: float | None, poll_secs: float,
                  clock: Clock, verify: str, rejected: set[str]) -> str | None:
    deadline = None if timeout is None else clock.monotonic() + timeout
    while True:
        path = latest_checkpoint(watched.directory, storage=watched.storage)
        if path is not None and path != last and path not in rejected:
            try:
                verify_checkpoint(path, verify, storage=watched.storage)
                return path
            except CheckpointVanishedError:
                continue  # deleted by retention meanwhile: the index already names a newer one
            except CheckpointNotFoundError:
                pass
            except CheckpointCorruptError as e:
                rejected.add(path)
                logger.warning("not yielding %s: %s", path, e)
        if deadline is not None and clock.monotonic() + poll_secs > deadline:
            return None
        clock.sleep(poll_secs)
