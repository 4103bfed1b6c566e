"""A verified checkpoint read once per job and shared over the process group (issue 31).

Restoring a ``state.pt`` checkpoint in a distributed job, the chief reads and verifies it from
storage as a single process would (`supervisor.checkpoint.load.loader`, into a private copy) and
keeps that copy (`keep_copy=True`). `share_copy` then sends its bytes to every rank
(`supervisor.distributed.restore.broadcast_bytes`: chunks of at most 64 MiB over the default
group); `receive_copy` writes them on each other rank into a private copy of its own (a sealed
memory file, as the loader's), computing their CRC-32 on the way, and checks size and checksum
against the checkpoint's manifest — which the chief posted with its decision — before anything
is unpickled. A rank whose received bytes differ fails loudly (`CheckpointCorruptError`).

Storage bytes read per restore: the checkpoint once (1.0×), whatever the world size; network
bytes: the checkpoint to each of the W-1 other ranks (a broadcast: a tree or ring inside the
backend); memory on a receiving rank: the checkpoint plus one chunk.
"""
from __future__ import annotations

import errno
import os
from typing import Any

from supervisor.checkpoint.storage.fileio import crc32, format_checksum
from supervisor.checkpoint.layout.format import STATE_FILE, Manifest
from supervisor.checkpoint.load.private_copy import MEMORY_FILES, PrivateCopy, check_fits, seal_memory_file
from supervisor.distributed.restore import CHUNK_BYTES, broadcast_bytes
from supervisor.errors import CheckpointCorruptError

__all__ = ["share_copy", "receive_copy"]


def share_copy(copy: PrivateCopy, *, where: str, chunk_bytes: int = CHUNK_BYTES) -> None:
    """The chief's side: broadcasts the bytes of its verified private ``copy`` of ``where`` (a
    collective; every other rank calls `receive_copy` with the same ``chunk_bytes``)."""
    with copy.open(where) as source:

        def fill(offset: int, view: memoryview) -> None:
            source.seek(offset)
            done = 0
            while done < len(view):
                n = source.readinto(view[done:])
                if not n:
                    raise OSError(errno.EIO, f"the private copy of {where} ended after {offset + done} bytes")
                done += n

        broadcast_bytes(copy.size, src=0, fill=fill, chunk_bytes=chunk_bytes)


def receive_copy(path: str, manifest_text: str, *, src: int = 0, verify: str = "full",
                 chunk_bytes: int = CHUNK_BYTES) -> tuple[Manifest, PrivateCopy]:
    """Another rank's side: receives ``path``'s ``state.pt`` from ``src`` into a private copy,
    checked against ``manifest_text`` (size always, checksum with ``verify="full"``).

    Raises:
        CheckpointCorruptError: the manifest is unreadable, or the bytes received differ from it.
    """
    try:
        manifest = Manifest.from_json(manifest_text)
        record = manifest.files[STATE_FILE]
    except (ValueError, KeyError) as e:
        raise CheckpointCorruptError(f"{path}: the manifest the chief sent is unusable ({e})") from e
    where = f"{path.rstrip('/')}/{STATE_FILE}"
    copy = _receive(record.size, where, src, chunk_bytes)
    if verify == "full" and format_checksum(copy.crc or 0) != record.checksum:
        copy.close()
        raise CheckpointCorruptError(
            f"{where}: the bytes received from rank {src} have checksum {format_checksum(copy.crc or 0)}, "
            f"the manifest says {record.checksum}: this rank's copy differs from the checkpoint (damaged in "
            "transfer or in memory); nothing was loaded")
    return manifest, copy


def _receive(size: int, where: str, src: int, chunk_bytes: int) -> PrivateCopy:
    """``size`` bytes broadcast from ``src``, into a sealed memory file (a ``bytearray`` where
    there are none), with their CRC-32."""
    check_fits(size, where)
    crc = [0]
    if not (MEMORY_FILES and size > 0):
        buffer = bytearray(size)

        def into_buffer(offset: int, view: memoryview) -> None:
            buffer[offset:offset + len(view)] = view
            crc[0] = crc32(view, crc[0])

        broadcast_bytes(size, src=src, drain=into_buffer, chunk_bytes=chunk_bytes)
        return PrivateCopy(size, crc[0], data=buffer)
    memfd = os.memfd_create("supervisor-checkpoint", os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
    try:
        os.ftruncate(memfd, size)
        seal_memory_file(memfd, "F_SEAL_SHRINK", "F_SEAL_GROW")
        broadcast_bytes(size, src=src, drain=lambda offset, view: _write(memfd, offset, view, crc, where),
                        chunk_bytes=chunk_bytes)
        seal_memory_file(memfd, "F_SEAL_WRITE", "F_SEAL_SEAL")
        return PrivateCopy(size, crc[0], memfd=memfd)
    except BaseException:
        os.close(memfd)
        raise


def _write(memfd: int, offset: int, view: memoryview, crc: list[Any], where: str) -> None:
    crc[0] = crc32(view, crc[0])
    done = 0
    while done < len(view):
        try:
            done += os.pwrite(memfd, view[done:], offset + done)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise CheckpointCorruptError(f"{where} has more bytes than the memory available to receive "
                                             "it into") from None
            raise
