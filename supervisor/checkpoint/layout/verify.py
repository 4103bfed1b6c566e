"""Verifying a committed checkpoint against its manifest (SPEC §5.4), as untrusted input.

`check_checkpoint` checks what the commit protocol promised: the manifest is there, every file
it lists is a regular file directly inside the checkpoint with the recorded size and
(``verify="full"``) checksum. Nothing is opened before it is known to be a regular file, so a
FIFO, a device or a symlink loop planted in a checkpoint is reported, never waited on.

Three outcomes a reader must tell apart:

- `CheckpointNotFoundError`: nothing at the path;
- `CheckpointVanishedError`: the checkpoint was there and disappeared while being read —
  retention deleted it after a newer one was committed. Not damage: look at the index again;
- `CheckpointCorruptError`: it is there and fails verification (the message gives the reason).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Any

from supervisor.checkpoint.storage.fileio import checksum_file, file_kind
from supervisor.checkpoint.layout.format import MANIFEST_FILE, Manifest, read_manifest
from supervisor.checkpoint.layout.format_registry import format_of, unmarked
from supervisor.errors import CheckpointCorruptError, CheckpointNotFoundError, CheckpointVanishedError

#: torch.distributed.checkpoint's metadata file: a sharded checkpoint (supervisor.checkpoint.sharded)
#: has it, and no state.pt.
DCP_METADATA = ".metadata"

__all__ = ["VERIFY_MODES", "check_verify", "check_checkpoint", "check_sizes", "checksum_all",
           "compare_checksum", "raise_if_vanished"]

VERIFY_MODES = ("full", "size")


def check_verify(verify: Any) -> str:
    """Validates a ``verify=`` argument: ``"full"`` (sizes and checksums) or ``"size"``."""
    if not isinstance(verify, str) or verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(map(repr, VERIFY_MODES))} ('full': sizes and "
                         f"checksums, 'size': sizes only), got {verify!r}")
    return verify


def check_checkpoint(path: str, verify: str = "full") -> Manifest:
    """Verifies a committed checkpoint without loading it; returns its manifest.

    Raises:
        ValueError: ``verify`` is not one of `VERIFY_MODES`.
        CheckpointNotFoundError: ``path`` does not exist.
        CheckpointVanishedError: it was deleted while being verified (retention; not damage).
        CheckpointCorruptError: it exists but fails verification; the message gives the reason.
    """
    verify = check_verify(verify)
    manifest = check_sizes(path)
    if verify == "full":
        checksums: dict[str, Any] = {}
        checksum_all(path, manifest, checksums)
        for name, record in manifest.files.items():
            compare_checksum(path, name, record.checksum, checksums.get(name))
    return manifest


def raise_if_vanished(path: str, cause: BaseException | None = None) -> None:
    """Raises `CheckpointVanishedError` when the checkpoint directory is gone (it was there when
    the caller started reading it)."""
    if not os.path.isdir(path):
        raise CheckpointVanishedError(f"{path}: was deleted while being read (retention removed it after "
                                      "a newer checkpoint was committed; it was not damaged)") from cause


def check_sizes(path: str) -> Manifest:
    """The manifest of ``path`` after checking every file it lists exists with its size."""
    if not os.path.isdir(path):
        raise CheckpointNotFoundError(f"{path}: does not exist")
    try:
        _regular_size(path, MANIFEST_FILE)
        manifest = read_manifest(path)
    except FileNotFoundError:
        raise_if_vanished(path)
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is missing (the write was never sealed)") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise_if_vanished(path, e)
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} is unreadable ({e})") from e
    if format_of(manifest.files) is None:  # no format's file (§12)
        raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} {unmarked(manifest.files)}")
    for name, record in manifest.files.items():
        if not name or os.sep in name or (os.altsep and os.altsep in name) or name in (os.curdir, os.pardir):
            raise CheckpointCorruptError(f"{path}: {MANIFEST_FILE} lists {name!r}, which is not a file name "
                                         "inside the checkpoint")
        size = _regular_size(path, name)
        if size != record.size:
            raise CheckpointCorruptError(f"{path}: {name} has {size} bytes, the manifest says {record.size} "
                                         "(truncated or overwritten)")
    return manifest


def _regular_size(path: str, name: str) -> int:
    """The size of ``path/name`` if it is a regular file; never opens it."""
    try:
        st = os.stat(os.path.join(path, name))
    except FileNotFoundError:
        raise_if_vanished(path)
        if name == MANIFEST_FILE:
            raise
        raise CheckpointCorruptError(f"{path}: {name} is missing") from None
    except OSError as e:  # ELOOP (a symlink loop), EACCES, EIO...
        raise_if_vanished(path, e)
        code = errno.errorcode.get(e.errno or 0, "OSError")
        raise CheckpointCorruptError(f"{path}: {name} cannot be examined ({code}: {e.strerror or e})") from e
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointCorruptError(f"{path}: {name} is not a regular file ({file_kind(st.st_mode)}); "
                                     "refusing to read it")
    return st.st_size


def _checksum(path: str, name: str) -> str | BaseException:
    try:
        return checksum_file(os.path.join(path, name))[1]  # read, never mapped: a truncation is no SIGBUS
    except OSError as e:
        return e


def checksum_all(path: str, manifest: Manifest, out: dict[str, Any]) -> None:
    """Fills ``out[name]`` with each file's checksum, or the `OSError` reading it raised."""
    for name in manifest.files:
        out[name] = _checksum(path, name)


def compare_checksum(path: str, name: str, expected: str, actual: Any) -> None:
    """Raises unless ``actual`` (from `checksum_all`) is ``expected``."""
    if isinstance(actual, BaseException):
        raise_if_vanished(path, actual)
    if isinstance(actual, BaseException) or actual is None:
        raise CheckpointCorruptError(f"{path}: {name} cannot be read to verify it ({actual})")
    if actual != expected:
        raise CheckpointCorruptError(f"{path}: {name} checksum {actual} does not match the manifest's "
                                     f"{expected} (the file is damaged)")
