"""The one verified loader (SPEC §5.4, §10.4, §14): a committed checkpoint read once through its
`Storage`, checksummed while it is read, into a private copy; unpickled only once it verified.
Every reader loads through here: a restore (`load_verified`, `supervisor.checkpoint.load.choose`),
the evaluator and ``load_checkpoint`` (`read_checkpoint`).

1. ``Storage.open_snapshot`` opens the checkpoint and its ``MANIFEST.json``; the manifest is
   read, then every file it lists is opened in the same snapshot — before any of them is read.
   Locally that is one ``O_DIRECTORY`` descriptor and the files opened relative to it (regular
   files only: a FIFO never blocks): retention renaming the directory aside and unlinking its
   files cannot pull bytes away (POSIX keeps an open inode), nor mix files of two checkpoints.
   On an object store (``s3://``) the snapshot is one listing: each object is read with ranged
   ``GetObject`` requests carrying ``If-Match`` on the ETag listed, so the bytes come from the
   versions the manifest vouches for or the read fails.
2. Each file is read once into a private copy (`supervisor.checkpoint.load.private_copy`: for
   ``state.pt`` a sealed memory file nobody can truncate, so no SIGBUS), its CRC-32 computed on
   the way, and compared with the manifest (size and, with ``verify="full"``, checksum).
3. Only then is ``state.pt`` unpickled (`Unpickling.load`: ``weights_only``, the reader's
   allow-list resolved once into its `Unpickling` record, never unsafe unpickling), mapped from the copy when ``mmap`` (the tensors are views
   of it: no second copy; ``mapped``); another format (a sharded checkpoint) is assembled from the copies by
   its reader in `supervisor.checkpoint.layout.format_registry`. Bytes read: its size, manifest included (1.0×).

Errors: `CheckpointVanishedError` (a `CheckpointNotFoundError`) when the checkpoint was deleted
before its files could be opened — skip it, a newer one exists; `CheckpointCorruptError` when it
is damaged (missing manifest or file, wrong size, wrong checksum, unloadable payload; on an
object store a prefix without a manifest is no checkpoint at all: `CheckpointNotFoundError`);
`CheckpointError` when it verifies but needs an untrusted global.
"""
from __future__ import annotations

import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from supervisor.checkpoint.storage.fileio import NotARegularFileError, format_checksum
from supervisor.checkpoint.layout.fencing import check_not_orphaned
from supervisor.checkpoint.layout.format_registry import format_of, unmarked
from supervisor.checkpoint.layout.format import MANIFEST_FILE, STATE_FILE, STEP_KEY, Manifest
from supervisor.checkpoint.load.private_copy import PrivateCopy, checksum_stream, copy_file
from supervisor.checkpoint.formats.safe_globals import Unpickling, describe_load_error
from supervisor.checkpoint.storage import Location, Storage, resolve_location, split_scheme, storage_for
from supervisor.checkpoint.storage.base import PreconditionFailedError, Snapshot, SnapshotVanishedError
from supervisor.checkpoint.layout.verify import VERIFY_MODES, check_checkpoint, check_sizes, check_verify
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError, CheckpointVanishedError

__all__ = ["CheckpointRead", "LoadedCheckpoint", "VerifiedFiles", "is_remote", "load_private_copy", "load_state_copy",
           "load_verified", "read_checkpoint", "read_unpickled", "read_verified_files", "resolve_storage", "verify_checkpoint"]

logger = logging.getLogger(__name__)

_MANIFEST_MAX_BYTES = 64 << 20  # a manifest lists file names and checksums: never this large
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint in memory: its path, step, manifest and the ``state.pt`` mapping."""

    path: str
    step: int
    manifest: Manifest
    payload: dict
    mapped: bool = False  # tensors are views of one private copy of state.pt (see load_verified)
    #: ``keep_copy``: the verified private copy of state.pt, open (`supervisor.checkpoint.load.shared_copy`)
    source: PrivateCopy | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class CheckpointRead(LoadedCheckpoint):
    """A `LoadedCheckpoint` read by `read_checkpoint`, plus the bytes read to get it and whether
    retention deleted (or moved aside) the checkpoint while it was being read — read whole
    anyway, from the snapshot."""

    bytes_read: int = 0
    deleted_while_reading: bool = False


@dataclass
class VerifiedFiles:
    """Every file of one checkpoint, read once and verified (`read_verified_files`)."""

    path: str
    manifest: Manifest
    manifest_bytes: int
    copies: dict[str, PrivateCopy] = field(default_factory=dict)
    deleted_while_reading: bool = False

    @property
    def bytes_read(self) -> int:
        return self.manifest_bytes + sum(copy.size for copy in self.copies.values())

    def close(self) -> None:
        for copy in self.copies.values():
            copy.close()


def resolve_storage(path: str | os.PathLike | Location, storage: Storage | None = None,
                    storage_options: Mapping[str, Any] | None = None) -> tuple[Storage, str]:
    """``(storage, path in its spelling)``: ``storage`` if given, a `Location`'s own (no client
    built), else `storage_for` the path (a local path → `LocalStorage`, ``s3://`` → the object store)."""
    if isinstance(path, Location):
        location = resolve_location(path, storage_options)  # refuses options for a resolved one
        return storage or location.storage, location.path
    text = os.fspath(path)
    scheme, spelled = split_scheme(text)
    if storage is not None:
        return storage, spelled if scheme == "file" else text
    return storage_for(text, storage_options), spelled


def is_remote(storage: Storage) -> bool:
    """Whether ``storage`` is an object store (no directories: a prefix is a checkpoint only
    with its manifest)."""
    return storage.is_object_store


# ---------------------------------------------------------------- the loader
def read_checkpoint(path: str | os.PathLike, *, verify: str = "full", trusted_globals: Iterable[Any] = (),
                    map_location: Any = "cpu", storage_options: Mapping[str, Any] | None = None,
                    storage: Storage | None = None) -> CheckpointRead:
    """Opens, verifies and loads the committed checkpoint at ``path`` in one read.

    Args:
        path: a checkpoint directory (``logdir/model.ckpt-N``) or URL (``s3://bucket/run/model.ckpt-N``).
        verify: ``"full"`` (sizes and checksums) or ``"size"`` (sizes only: the CRC is skipped,
            the data is still read once).
        trusted_globals: globals ``torch.load(weights_only=True)`` may load in addition.
        map_location: where tensors go (``torch.load``'s argument).
        storage_options: for an object-store URL, the client's options (``endpoint_url``, ...).
        storage: a `Storage` to read through instead of the one the path names.

    Raises:
        CheckpointVanishedError: deleted before it could be opened.
        CheckpointCorruptError: damaged; the message says how.
        CheckpointError: verified, but needs a global that is not trusted.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY_MODES))}, got {verify!r}")
    unpickling = Unpickling(trusted_globals, map_location)  # the allow-list of this read, resolved once
    return read_unpickled(*resolve_storage(path, storage, storage_options), verify=verify, unpickling=unpickling)


def read_unpickled(storage: Storage, path: str, *, verify: str, unpickling: Unpickling) -> CheckpointRead:
    """`read_checkpoint` of a resolved ``path`` (in ``storage``'s spelling) with a reader's record."""
    files = read_verified_files(storage, path, verify=verify, missing=CheckpointVanishedError)
    manifest, bytes_read = files.manifest, files.bytes_read
    # the manifest's format (_open_listed let only registered ones through) reads its files
    payload, mapped = format_of(manifest.files).read_files(path, files, unpickling)  # type: ignore[union-attr]
    return CheckpointRead(path=path, step=manifest.step, manifest=manifest, payload=payload, mapped=mapped,
                          bytes_read=bytes_read, deleted_while_reading=files.deleted_while_reading)


def load_verified(path: str, *, verify: str = "full", unpickling: Unpickling = Unpickling(), mmap: bool = False,
                  storage: Storage | None = None, keep_copy: bool = False) -> LoadedCheckpoint:
    """Verifies and loads the checkpoint at ``path`` for a restore (see the module docstring).

    With ``mmap=True`` the tensors are views of the private copy (zero further copies;
    ``mapped``), else they are loaded into tensors of their own. Either way they stay valid after
    the checkpoint is deleted or truncated: the checkpoint file itself is never mapped.
    ``unpickling``: the restorer's allow-list and ``map_location`` (`Unpickling`, made once). With
    ``keep_copy`` the verified copy stays open as ``source`` (the caller closes it): a chief
    shares it with the other ranks instead of each reading the checkpoint again.

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointNotFoundError: nothing at ``path``.
        CheckpointVanishedError: deleted while it was being opened (retention; not damage).
        CheckpointCorruptError: damaged; the message says how.
        CheckpointError: a format that is not one file (a sharded checkpoint: the message says
            what loads it), or it verifies but needs a global that is not trusted.
    """
    verify = check_verify(verify)
    storage, path = resolve_storage(path, storage)
    if not is_remote(storage):
        # Locally, every listed file is examined by ``stat`` first (metadata only: nothing is
        # opened before it is known to be a regular file, and a failing one is named with its
        # errno, e.g. ELOOP/EIO); then the one read below.
        check_sizes(path)
    files = read_verified_files(storage, path, verify=verify, missing=CheckpointNotFoundError)
    fmt = format_of(files.manifest.files)
    if fmt is None or not fmt.single_file:
        files.close()
        raise CheckpointError(f"{path} is {fmt.description} (checkpoint_format={fmt.name!r}); "  # type: ignore[union-attr]
                              f"{fmt.restore_hint}")  # type: ignore[union-attr]
    if not fmt.torch_file:  # a format of its own decoding (no torch.load, no shared copy): its read
        return LoadedCheckpoint(path, files.manifest.step, files.manifest, *fmt.read_files(path, files, unpickling))
    copy = files.copies.pop(fmt.marker)
    files.close()
    mapped = mmap and copy.path is not None
    payload = load_state_copy(path, files.manifest, copy, unpickling, mmap=mmap, keep=keep_copy)
    return LoadedCheckpoint(path, files.manifest.step, files.manifest, payload, mapped=mapped,
                            source=copy if keep_copy else None)


def load_private_copy(copy: PrivateCopy, state_path: str, *, unpickling: Unpickling, step: int | None,
                      mmap: bool) -> Any:
    """``unpickling.load`` (``torch.load(weights_only=True)``) of a verified private copy of
    ``state_path`` (named in errors): mapped when ``mmap`` and the copy is a memory file holding a
    zip archive (the only format torch maps), else read into tensors of their own."""
    if copy.path is not None:
        mmap = mmap and copy.head(len(_ZIP_MAGIC)) == _ZIP_MAGIC
        return unpickling.load(copy.path, step=step, mmap=mmap, shown_as=state_path)
    with copy.open(state_path) as source:
        return unpickling.load(source, step=step)


def load_state_copy(path: str, manifest: Manifest, copy: PrivateCopy, unpickling: Unpickling, *, mmap: bool,
                    keep: bool = False) -> dict:
    """The payload of a verified ``state.pt`` copy, checked against the manifest; the copy is
    released after (with ``keep``, only when the load fails)."""
    state_path = f"{path.rstrip('/')}/{STATE_FILE}" if "://" in path else os.path.join(path, STATE_FILE)
    payload = None
    try:
        payload = load_private_copy(copy, state_path, unpickling=unpickling, step=manifest.step, mmap=mmap)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        is_zip = copy.head(len(_ZIP_MAGIC)) == _ZIP_MAGIC
        error = CheckpointCorruptError(f"{path}: {STATE_FILE} cannot be loaded ({describe_load_error(e, is_zip=is_zip)})")
        # torch's unpickling errors advise loading unsafely: never chain (and print) that advice.
        raise error from (None if isinstance(e, pickle.UnpicklingError) else e)
    finally:
        step = payload.get(STEP_KEY, manifest.step) if isinstance(payload, dict) else None
        if not keep or step != manifest.step:  # not loaded, or not what the manifest says
            copy.close()
    if not isinstance(payload, dict):
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} holds a {type(payload).__name__}, not a mapping")
    if step != manifest.step:
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} is of step {step}, the manifest says "
                                     f"{manifest.step} (files of two checkpoints mixed)")
    return payload


def verify_checkpoint(path: str | os.PathLike, verify: str = "full", *, storage: Storage | None = None,
                      storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """Verifies a committed checkpoint without loading it; returns its manifest.

    Locally: `supervisor.checkpoint.layout.verify.check_checkpoint` (sizes by ``stat``, checksums on
    parallel threads, nothing opened before it is known to be a regular file). On an object
    store: the snapshot of the loader, every object read once with its CRC-32 computed on the
    way and kept nowhere (``verify="size"``: the listing's sizes only, no data read).

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointNotFoundError: nothing at ``path`` (on an object store: no manifest).
        CheckpointVanishedError: deleted while it was verified (retention; not damage).
        CheckpointCorruptError: it fails verification; the message gives the reason.
    """
    verify = check_verify(verify)
    storage, path = resolve_storage(path, storage, storage_options)
    if not is_remote(storage):
        return check_checkpoint(path, verify=verify)
    files = read_verified_files(storage, path, verify=verify, missing=CheckpointNotFoundError, keep=False)
    return files.manifest


# ---------------------------------------------------------------- reading the files
def read_verified_files(storage: Storage, path: str, *, verify: str = "full",
                        missing: type[CheckpointNotFoundError] = CheckpointVanishedError,
                        keep: bool = True) -> VerifiedFiles:
    """Every file the manifest of ``path`` lists, read once into private copies (``state.pt``: a
    sealed memory file; the others: buffers), sizes and (``verify="full"``) checksums checked.
    ``missing``: the error when nothing is at ``path`` (a restore's candidate that does not
    exist is not found; a checkpoint an evaluator was told about has vanished). ``keep=False``:
    verify only (checksums computed while reading, no copy kept; ``verify="size"`` reads nothing)."""
    snapshot = _open_snapshot(storage, path, missing)
    files: VerifiedFiles | None = None
    try:
        manifest, size = _read_manifest(snapshot, path)
        files = VerifiedFiles(path, manifest, size)
        _open_listed(snapshot, path, manifest)
        for name in manifest.files:
            if keep:
                files.copies[name] = _read_verified(snapshot, path, name, manifest, verify == "full")
            else:
                _check_file(snapshot, path, name, manifest, verify == "full")
        files.deleted_while_reading = snapshot.vanished()
    except BaseException:
        if files is not None:
            files.close()
        raise
    finally:
        snapshot.close()
    return files


def _open_snapshot(storage: Storage, path: str, missing: type[CheckpointNotFoundError]) -> Snapshot:
    try:
        return storage.open_snapshot(path, [MANIFEST_FILE])
    except SnapshotVanishedError:
        if missing is CheckpointVanishedError:
            raise CheckpointVanishedError(f"{path}: does not exist (deleted before it could be read)") from None
        raise missing(f"{path}: does not exist") from None
    except FileNotFoundError:
        if is_remote(storage):  # no manifest: a write in progress or interrupted, never a checkpoint
            raise CheckpointNotFoundError(f"{path}: no committed checkpoint ({MANIFEST_FILE} is missing: a write "
                                          "in progress or interrupted)") from None
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is missing (the write was never sealed)") from None
    except NotADirectoryError:
        raise CheckpointCorruptError(f"{path}: not a checkpoint directory") from None
    except OSError as e:
        raise CheckpointCorruptError(_opening_problem(path, MANIFEST_FILE, e)) from e


def _opening_problem(path: str, name: str, error: OSError) -> str:
    if isinstance(error, NotARegularFileError):  # "<path>: <name> is not a regular file (a FIFO); refusing..."
        return error.strerror or str(error)
    return f"{path}: {name} cannot be opened ({error})"


def _read_manifest(snapshot: Snapshot, path: str) -> tuple[Manifest, int]:
    reader = snapshot.files[MANIFEST_FILE]
    if snapshot.sizes[MANIFEST_FILE] > _MANIFEST_MAX_BYTES:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is larger than {_MANIFEST_MAX_BYTES} bytes")
    try:
        data = reader.read(_MANIFEST_MAX_BYTES + 1)
    except (FileNotFoundError, PreconditionFailedError):
        raise CheckpointVanishedError(f"{path}: deleted while being opened") from None
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} cannot be read ({e})") from e
    if len(data) > _MANIFEST_MAX_BYTES:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is larger than {_MANIFEST_MAX_BYTES} bytes")
    try:
        return Manifest.from_json(data), len(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is unreadable ({e})") from e


def _open_listed(snapshot: Snapshot, path: str, manifest: Manifest) -> None:
    """Opens every file the manifest lists in the snapshot, before any is read."""
    if format_of(manifest.files) is None:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} {unmarked(manifest.files)}")
    listing = getattr(snapshot, "listing", None)  # an object store's (fencing.py)
    if listing is not None:
        check_not_orphaned(path, manifest, listing)
    for name in manifest.files:
        if not name or "/" in name or os.sep in name or name in (os.curdir, os.pardir, MANIFEST_FILE):
            raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} lists {name!r}, not a file of the checkpoint")
        _open_in(snapshot, path, manifest.key(name))


def _open_in(snapshot: Snapshot, path: str, name: str) -> None:
    """Opens ``name`` in the snapshot; a missing file means "vanished" when the checkpoint is
    no longer at ``path`` (retention moved it aside), else "damaged"."""
    try:
        snapshot.open(name)
    except SnapshotVanishedError:
        raise CheckpointVanishedError(f"{path}: deleted while being opened") from None
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: {name} is missing") from None
    except OSError as e:
        raise CheckpointCorruptError(_opening_problem(path, name, e)) from e


def _check_file(snapshot: Snapshot, path: str, name: str, manifest: Manifest, checksum: bool) -> None:
    record, name = manifest.files[name], manifest.key(name)
    _check_size(snapshot, path, name, record.size)
    if not checksum:
        return
    try:
        crc = checksum_stream(snapshot.files[name], record.size, f"{path}: {name}")
    except (FileNotFoundError, PreconditionFailedError):
        raise CheckpointVanishedError(f"{path}: {name} was deleted or replaced while being read (retention "
                                      "removed the checkpoint; it was not damaged)") from None
    _check_checksum(path, name, crc, record.checksum)


def _check_size(snapshot: Snapshot, path: str, name: str, expected: int) -> None:
    size = snapshot.sizes[name]
    if size != expected:
        raise CheckpointCorruptError(f"{path}: {name} has {size} bytes, the manifest says {expected} "
                                     "(truncated or overwritten)")


def _check_checksum(path: str, name: str, crc: int, expected: str) -> None:
    if format_checksum(crc) != expected:
        raise CheckpointCorruptError(f"{path}: {name} checksum {format_checksum(crc)} does not match "
                                     f"the manifest's {expected} (the file is damaged)")


def _read_verified(snapshot: Snapshot, path: str, name: str, manifest: Manifest, checksum: bool) -> PrivateCopy:
    """Reads the whole file once into a private copy, computing its CRC-32 on the way; checks
    size and checksum."""
    record, key = manifest.files[name], manifest.key(name)
    _check_size(snapshot, path, key, record.size)
    fmt = format_of(manifest.files)  # a single-file format's file is copied where torch can map it
    try:
        copy = copy_file(snapshot.files[key], record.size, f"{path}: {key}", checksum=checksum,
                         in_buffer=fmt is None or not fmt.single_file or name != fmt.marker)
    except (FileNotFoundError, PreconditionFailedError):  # an object deleted or replaced meanwhile
        raise CheckpointVanishedError(f"{path}: {name} was deleted or replaced while being read (retention "
                                      "removed the checkpoint; it was not damaged)") from None
    if checksum:
        try:
            _check_checksum(path, key, copy.crc or 0, record.checksum)
        except CheckpointCorruptError:
            copy.close()
            raise
    return copy
