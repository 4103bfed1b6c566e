"""Whole-object reads of an object store (what a verified restore, ``load_checkpoint`` and the
evaluator do): a few large ranged ``GetObject`` requests (``max_concurrency`` of them, each at
least ``min_range_size``), streamed straight into the private copy with the CRC-32 computed on
arrival, every byte read once, every request carrying ``If-Match`` on the ETag listed — against
the real moto server."""
from __future__ import annotations

import os
import threading
import zlib

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint.storage.s3.store import ObjectStoreStorage  # noqa: E402
from supervisor.checkpoint.load.private_copy import checksum_stream, copy_file  # noqa: E402
from supervisor.checkpoint.storage.base import PreconditionFailedError  # noqa: E402
from tests.s3_fixtures import assert_copy_holds  # noqa: E402

pytestmark = pytest.mark.timeout(90)
MiB = 1 << 20


class _Recorded(ObjectStoreStorage):
    """Records every ranged read: (start, length asked, bytes returned, If-Match, streamed)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.ranges: list[tuple[int, int, int, str | None, bool]] = []

    def read_range(self, path, start, length, *, if_match=None, into=None, on_piece=None):
        data = super().read_range(path, start, length, if_match=if_match, into=into, on_piece=on_piece)
        with self.lock:
            self.ranges.append((start, length, len(data), if_match, into is not None))
        return data


def _object(s3_storage, s3_root, size: int, **knobs) -> tuple[_Recorded, bytes, str]:
    storage = _Recorded(s3_storage.fs, **knobs)
    data = os.urandom(size)
    path = storage.join(s3_root, "model.ckpt-1", "state.pt")
    storage.write_atomic(path, data)
    return storage, data, path


@pytest.mark.parametrize("in_buffer", [False, True])
def test_a_whole_read_is_max_concurrency_streamed_ranges_read_once(s3_storage, s3_root, in_buffer):
    storage, data, path = _object(s3_storage, s3_root, 24 * MiB + 7, min_range_size=5 * MiB, max_concurrency=2)
    directory = storage.dirname(path)
    with storage.open_snapshot(directory, ["state.pt"]) as snapshot:
        etag = snapshot.listing["state.pt"].version
        with copy_file(snapshot.files["state.pt"], len(data), path, in_buffer=in_buffer) as copy:
            assert_copy_holds(copy, data)
    # two ranges (24 MiB + 7 bytes split in max_concurrency=2, rounded up to a MiB: 13 + 11),
    # not five of min_range_size: one request per range, each streamed into the copy
    assert sorted(r[:3] for r in storage.ranges) == [(0, 13 * MiB, 13 * MiB), (13 * MiB, len(data) - 13 * MiB,
                                                                                 len(data) - 13 * MiB)]
    assert all(r[3] == etag and r[4] for r in storage.ranges)
    assert sum(r[2] for r in storage.ranges) == len(data)  # every byte once


def test_small_objects_are_read_in_min_range_size_ranges_and_verification_alone_keeps_nothing(s3_storage, s3_root):
    storage, data, path = _object(s3_storage, s3_root, 11 * MiB, min_range_size=5 * MiB, max_concurrency=8)
    with storage.open_snapshot(storage.dirname(path), ["state.pt"]) as snapshot:
        with copy_file(snapshot.files["state.pt"], len(data), path) as copy:
            assert copy.crc == zlib.crc32(data)
        assert [r[:3] for r in sorted(storage.ranges)] == [(0, 5 * MiB, 5 * MiB), (5 * MiB, 5 * MiB, 5 * MiB),
                                                           (10 * MiB, MiB, MiB)]
        storage.ranges.clear()
        assert checksum_stream(snapshot.files["state.pt"], len(data), path) == zlib.crc32(data)
    assert sum(r[2] for r in storage.ranges) == len(data)


def test_an_object_replaced_after_the_listing_is_refused_not_mixed(s3_storage, s3_root):
    """If-Match on every streamed range: a rewrite after the listing fails the read (the loader
    calls that "vanished": a newer checkpoint exists), never a copy mixing two versions."""
    storage, data, path = _object(s3_storage, s3_root, 12 * MiB, min_range_size=5 * MiB, max_concurrency=2)
    with storage.open_snapshot(storage.dirname(path), ["state.pt"]) as snapshot:
        storage.write_atomic(path, os.urandom(len(data)))
        with pytest.raises(PreconditionFailedError):
            copy_file(snapshot.files["state.pt"], len(data), path)


def test_read_range_into_a_buffer_streams_pieces_in_order(s3_storage, s3_root):
    storage, data, path = _object(s3_storage, s3_root, 5 * MiB + 3)
    target = bytearray(5 * MiB)
    pieces: list[bytes] = []
    got = storage.read_range(path, 3, 5 * MiB, into=target, on_piece=lambda piece: pieces.append(bytes(piece)))
    assert bytes(got) == bytes(target) == data[3:] and b"".join(pieces) == data[3:]
    assert len(pieces) >= 2  # handed over in pieces as they arrive, not at the end
    assert bytes(storage.read_range(path, len(data) - 2, 10, into=bytearray(10))) == data[-2:]  # fewer at the end


def test_the_read_knobs_come_from_storage_options_and_bad_ones_are_refused(s3_server):
    from supervisor.checkpoint.storage import storage_for
    from tests.s3_fixtures import options

    storage = storage_for("s3://x", {**options(s3_server.endpoint), "min_range_size": 32 * MiB, "max_concurrency": 4})
    assert (storage.min_range_size, storage.max_concurrency) == (32 * MiB, 4)
    assert storage_for("s3://x", options(s3_server.endpoint)).min_range_size == 16 * MiB  # the default
    with pytest.raises(ValueError, match="min_range_size must be a positive number of bytes, got 0"):
        ObjectStoreStorage(storage.fs, min_range_size=0)
    with pytest.raises(ValueError, match=r"part_size must be at least 5242880 bytes \(5 MiB: S3's smallest part"):
        storage_for("s3://x", {**options(s3_server.endpoint), "part_size": 1 << 20})
    with pytest.raises(ValueError, match="multipart_checksum must be one of CRC32, .* or None, got 'MD5'"):
        ObjectStoreStorage(storage.fs, multipart_checksum="MD5")


@pytest.mark.parametrize("algorithm", ["CRC32", None])
def test_multipart_uploads_carry_the_configured_checksum_algorithm(s3_storage, s3_root, algorithm):
    """Each part travels with its CRC-32 and the object gets the composite checksum of its parts
    (what ``aws s3 cp --checksum-algorithm CRC32`` does); ``multipart_checksum=None`` sends none."""
    storage = ObjectStoreStorage(s3_storage.fs, part_size=5 * MiB, max_concurrency=2, multipart_checksum=algorithm)
    data = os.urandom(11 * MiB)
    path = storage.join(s3_root, "model.ckpt-1", "state.pt")
    with storage.open_write(path) as writer:
        writer.write(data)
        writer.sync()
    assert writer.checksum == f"crc32:{zlib.crc32(data):08x}"
    head = storage.call("head_object", path, ChecksumMode="ENABLED")
    assert head["ContentLength"] == len(data) and head["ETag"].endswith('-3"')  # three parts
    assert ("ChecksumCRC32" in head) == (algorithm == "CRC32")  # moto omits S3's "-3" and ChecksumType
    assert storage.read_bytes(path) == data


def _cut_ranged_bodies(command: str, headers: object, body: bytes) -> bytes:
    """Only the first half of each ranged ``GetObject``'s body reaches the client (its
    Content-Length promises all), then the connection closes."""
    return body[:len(body) // 2] if command == "GET" and "Range" in headers else body


def test_a_body_cut_mid_range_is_an_error_never_a_short_copy(s3_server, s3_storage, s3_root):
    from supervisor.checkpoint.storage import storage_for
    from supervisor.errors import CheckpointCorruptError
    from tests.s3_fixtures import FaultProxy, options

    storage, data, path = _object(s3_storage, s3_root, 6 * MiB, min_range_size=5 * MiB, max_concurrency=2)
    with FaultProxy(s3_server.port, body_filter=_cut_ranged_bodies) as proxy:
        opts = {**options(proxy.endpoint), "skip_instance_cache": True, "min_range_size": 5 * MiB}
        cut = storage_for(s3_root, opts)
        with cut.open_snapshot(cut.dirname(path), ["state.pt"]) as snapshot:
            with pytest.raises(CheckpointCorruptError, match="state.pt (cannot be read|ended after)"):
                copy_file(snapshot.files["state.pt"], len(data), path)
