"""Read a committed checkpoint once, from open descriptors, verifying it in the same read
(SPEC §5.5, §10.4): what an evaluator uses while a trainer writes and deletes underneath it.

`read_checkpoint(path)`:

1. opens the checkpoint directory (``O_DIRECTORY``) and then, relative to that descriptor,
   ``MANIFEST.json`` and every file the manifest lists — before reading any of them. From then
   on every byte comes from those inodes: retention renames the directory aside and unlinks its
   files, but on POSIX an open descriptor keeps the inode and its data, so the read can neither
   lose bytes mid-way nor mix files of two checkpoints (a writer never rewrites a committed
   file in place: it writes a new temp directory and renames it).
2. reads each file once into a private copy in memory, computing its CRC-32 as it goes (the
   manifest's checksum; `supervisor.checkpoint.private_copy`: for ``state.pt`` a sealed memory
   file nobody can truncate), and compares size and checksum with the manifest;
3. only then unpickles ``state.pt`` from that copy with ``torch.load(weights_only=True,
   mmap=True)`` (the tensors are views of the copy: no second copy; ``mapped``)
   (`supervisor.checkpoint.restore.safe_torch_load`: ``trusted_globals`` opt-in, never unsafe
   unpickling), and checks that the payload's ``global_step`` is the manifest's step — or
   assembles a sharded checkpoint from those bytes (below).

Bytes read per checkpoint = its size (1.0×); the previous verify-then-load path read it twice.
Memory: about ``state.pt``'s size (the copy the tensors are views of; it is freed with the last
of them). Where ``memfd_create`` is missing, the copy is a ``bytearray`` and ``torch.load``
copies each record out of it into its tensor (peak about twice the size, the buffer released
right after). It is the same loader a restore uses (`supervisor.checkpoint.restore.load_private_copy`).

Errors: `CheckpointVanishedError` (a `CheckpointNotFoundError`) when the checkpoint was deleted
before its files could be opened — skip it, a newer one exists; `CheckpointCorruptError` when it
is damaged (missing manifest or file, wrong size, wrong checksum, unloadable payload);
`CheckpointError` when it verifies but needs an untrusted global.

A sharded checkpoint (``checkpoint_format="dcp"``: ``.metadata`` and the ranks' shard files, no
``state.pt``) is read the same way — every file opened first, read once, checksummed — and its
payload is assembled from those bytes by `supervisor.checkpoint.dcp_reading` (DCP's loader,
whole tensors in one process, unpickling restricted as for ``state.pt``).

`CheckpointVanishedError` is `supervisor.errors`' (the same one restore and ``verify`` raise),
re-exported here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from supervisor.checkpoint.fileio import NotARegularFileError, format_checksum, open_regular
from supervisor.checkpoint.format import MANIFEST_FILE, STATE_FILE, STEP_KEY, Manifest
from supervisor.checkpoint.private_copy import PrivateCopy, read_private_copy
from supervisor.checkpoint.restore import VERIFY_MODES, LoadedCheckpoint, load_private_copy
from supervisor.checkpoint.verify import DCP_METADATA
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointVanishedError

__all__ = ["CheckpointRead", "CheckpointVanishedError", "read_checkpoint"]

_MANIFEST_MAX_BYTES = 64 << 20  # a manifest lists file names and checksums: never this large


@dataclass(frozen=True)
class CheckpointRead(LoadedCheckpoint):
    """A `LoadedCheckpoint` read by `read_checkpoint`, plus the bytes read to get it and whether
    retention deleted (or moved aside) the checkpoint while it was being read — read whole
    anyway, from the open descriptors."""

    bytes_read: int = 0
    deleted_while_reading: bool = False


def read_checkpoint(path: str | os.PathLike, *, verify: str = "full", trusted_globals: Iterable[Any] = (),
                    map_location: Any = "cpu") -> CheckpointRead:
    """Opens, verifies and loads the committed checkpoint at ``path`` in one read.

    Args:
        path: a checkpoint directory (``logdir/model.ckpt-N``).
        verify: ``"full"`` (sizes and checksums) or ``"size"`` (sizes only: the CRC is skipped,
            the data is still read once).
        trusted_globals: globals ``torch.load(weights_only=True)`` may load in addition.
        map_location: where tensors go (``torch.load``'s argument).

    Raises:
        CheckpointVanishedError: deleted before it could be opened.
        CheckpointCorruptError: damaged; the message says how.
        CheckpointError: verified, but needs a global that is not trusted.
    """
    path = os.fspath(path)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY_MODES))}, got {verify!r}")
    dir_fd = _open_dir(path)
    try:
        manifest, manifest_bytes, fds = _open_all(dir_fd, path)
        contents: dict[str, PrivateCopy] = {}
        try:
            for name, fd in fds.items():
                contents[name] = _read_verified(fd, path, name, manifest, verify == "full")
        except BaseException:
            for copy in contents.values():
                copy.close()
            raise
        finally:
            for fd in fds.values():
                os.close(fd)
        deleted = _moved_or_deleted(dir_fd, path)
    finally:
        os.close(dir_fd)
    bytes_read = manifest_bytes + sum(copy.size for copy in contents.values())
    mapped = STATE_FILE in contents and contents[STATE_FILE].path is not None  # views of the private copy
    if STATE_FILE in contents:
        payload = _load(path, manifest, contents.pop(STATE_FILE), trusted_globals, map_location)
    else:  # a sharded checkpoint (_open_listed let only those through)
        from supervisor.checkpoint.dcp_reading import load_payload

        payload = load_payload(path, manifest.step, {name: copy.data for name, copy in contents.items()},
                               trusted_globals=trusted_globals, map_location=map_location)
    del contents
    return CheckpointRead(path=path, step=manifest.step, manifest=manifest, payload=payload, mapped=mapped,
                          bytes_read=bytes_read, deleted_while_reading=deleted)


# ---------------------------------------------------------------- opening
def _open_dir(path: str) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise CheckpointVanishedError(f"{path}: does not exist (deleted before it could be read)") from None
    except NotADirectoryError:
        raise CheckpointCorruptError(f"{path}: not a checkpoint directory") from None
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: cannot be opened ({e})") from e


def _open_all(dir_fd: int, path: str) -> tuple[Manifest, int, dict[str, int]]:
    """Reads the manifest and opens every file it lists; returns (manifest, its size, fds)."""
    manifest_fd = _open_in(dir_fd, path, MANIFEST_FILE)
    try:
        data = _read_small(manifest_fd, path)
    finally:
        os.close(manifest_fd)
    manifest = _parse_manifest(path, data)
    return manifest, len(data), _open_listed(dir_fd, path, manifest)


def _open_in(dir_fd: int, path: str, name: str) -> int:
    """Opens ``name`` inside the open directory; a missing file means "vanished" when the
    directory is no longer at ``path`` (retention renamed it aside), else "damaged"."""
    try:
        return open_regular(name, dir_fd=dir_fd)  # never blocks on a FIFO
    except NotARegularFileError as e:
        raise CheckpointCorruptError(f"{path}: {e}") from None
    except FileNotFoundError:
        if _moved_or_deleted(dir_fd, path):
            raise CheckpointVanishedError(f"{path}: deleted while being opened") from None
        if name == MANIFEST_FILE:
            raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is missing (the write was never sealed)") from None
        raise CheckpointCorruptError(f"{path}: {name} is missing") from None
    except OSError as e:
        raise CheckpointCorruptError(f"{path}: {name} cannot be opened ({e})") from e


def _moved_or_deleted(dir_fd: int, path: str) -> bool:
    try:
        here = os.stat(path)
    except FileNotFoundError:
        return True
    mine = os.fstat(dir_fd)
    return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino) or mine.st_nlink == 0


def _open_listed(dir_fd: int, path: str, manifest: Manifest) -> dict[str, int]:
    if STATE_FILE not in manifest.files and DCP_METADATA not in manifest.files:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} lists neither {STATE_FILE} nor {DCP_METADATA}")
    fds: dict[str, int] = {}
    try:
        for name in manifest.files:
            if os.path.basename(name) != name or name in (os.curdir, os.pardir):
                raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} lists {name!r}, not a file of the checkpoint")
            fds[name] = _open_in(dir_fd, path, name)
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


# ---------------------------------------------------------------- reading
def _read_small(fd: int, path: str) -> bytes:
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > _MANIFEST_MAX_BYTES:
            raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is larger than {_MANIFEST_MAX_BYTES} bytes")
        chunks.append(chunk)


def _parse_manifest(path: str, data: bytes) -> Manifest:
    try:
        return Manifest.from_json(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is unreadable ({e})") from e


def _read_verified(fd: int, path: str, name: str, manifest: Manifest, checksum: bool) -> PrivateCopy:
    """Reads the whole file once into a private copy (``state.pt``: a sealed memory file that
    ``torch.load`` maps; the others: a buffer), computing its CRC-32 on the way; checks size and
    checksum."""
    record = manifest.files[name]
    size = os.fstat(fd).st_size
    if size != record.size:
        raise CheckpointCorruptError(f"{path}: {name} has {size} bytes, the manifest says {record.size} "
                                     "(truncated or overwritten)")
    copy = read_private_copy(fd, size, f"{path}: {name}", checksum=checksum, in_buffer=name != STATE_FILE)
    if checksum and format_checksum(copy.crc or 0) != record.checksum:
        copy.close()
        raise CheckpointCorruptError(f"{path}: {name} checksum {format_checksum(copy.crc or 0)} does not match "
                                     f"the manifest's {record.checksum} (the file is damaged)")
    return copy



def _load(path: str, manifest: Manifest, copy: PrivateCopy, trusted_globals: Iterable[Any],
          map_location: Any) -> dict:
    state_path = os.path.join(path, STATE_FILE)
    try:
        payload = load_private_copy(copy, state_path, map_location=map_location, trusted_globals=trusted_globals,
                                    step=manifest.step, mmap=True)
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} cannot be loaded ({type(e).__name__}: {e})") from e
    finally:
        copy.close()
    if not isinstance(payload, dict):
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} holds a {type(payload).__name__}, not a mapping")
    step = payload.get(STEP_KEY, manifest.step)
    if step != manifest.step:
        raise CheckpointCorruptError(f"{path}: {STATE_FILE} is of step {step}, the manifest says "
                                     f"{manifest.step} (files of two checkpoints mixed)")
    return payload
