"""Verification's checksum through a memory map, split over threads: the same CRC-32 as zlib's."""
from __future__ import annotations

import os
import random
import zlib

import pytest

from supervisor.checkpoint import fileio


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 7, (3 << 20) + 12345])
def test_the_mapped_checksum_is_zlibs_crc32_of_the_whole_file(tmp_path, monkeypatch, size):
    monkeypatch.setattr(fileio, "_PARALLEL_MIN_BYTES", 1 << 20)  # several ranges, odd boundaries
    data = random.Random(size).randbytes(size)
    path = tmp_path / "state.pt"
    path.write_bytes(data)
    expected = fileio.format_checksum(zlib.crc32(data))
    for workers in (1, 2, 3):
        assert fileio.checksum_file(str(path), mapped=True, max_workers=workers, chunk_bytes=1 << 19) == (size, expected)
    assert fileio.checksum_file(str(path)) == (size, expected)


def test_a_flipped_byte_changes_the_mapped_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "_PARALLEL_MIN_BYTES", 1 << 20)
    data = bytearray(random.Random(1).randbytes(3 << 20))
    path = tmp_path / "state.pt"
    path.write_bytes(bytes(data))
    before = fileio.checksum_file(str(path), mapped=True)
    data[len(data) // 2 + 1] ^= 0x10  # in the second thread's range
    path.write_bytes(bytes(data))
    assert fileio.checksum_file(str(path), mapped=True) != before
    assert os.path.getsize(path) == 3 << 20
