"""`copy_file` of an object-store reader (``read_at``: one ranged request per chunk, several in
flight): the same bytes and CRC-32 as the file, into either kind of private copy; a short range
is damage, named."""
from __future__ import annotations

import os
import zlib

import pytest

from supervisor.checkpoint.load import private_copy
from supervisor.errors import CheckpointCorruptError
from tests.s3_fixtures import assert_copy_holds

pytestmark = pytest.mark.timeout(60)


class Ranged:
    def __init__(self, data: bytes, *, short: bool = False) -> None:
        self.data, self.short, self.requests = data, short, []

    def read_at(self, start: int, length: int) -> bytes:
        self.requests.append((start, length))
        piece = self.data[start:start + length]
        return piece[:-1] if self.short else piece


@pytest.mark.parametrize("size", [0, 5, private_copy._CHUNK_BYTES, 3 * private_copy._CHUNK_BYTES + 17])
@pytest.mark.parametrize("in_buffer", [False, True])
def test_ranged_copies_hold_the_bytes_and_their_crc(size, in_buffer):
    data = os.urandom(size)
    reader = Ranged(data)
    with private_copy.copy_file(reader, size, "s3://b/c/state.pt", in_buffer=in_buffer) as copy:
        assert_copy_holds(copy, data)
    assert sum(length for _, length in reader.requests) == size  # every byte requested once
    assert private_copy.checksum_stream(Ranged(data), size, "x") == zlib.crc32(data)


def test_a_short_range_is_damage_named_by_the_url():
    with pytest.raises(CheckpointCorruptError, match=r"s3://b/c/state.pt ended after 99 of 100 bytes"):
        private_copy.copy_file(Ranged(os.urandom(100), short=True), 100, "s3://b/c/state.pt")
