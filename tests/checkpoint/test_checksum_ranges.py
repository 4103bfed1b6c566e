"""Verification's checksum read in ranges on parallel threads (never through a memory map: a
truncation would be SIGBUS): the same CRC-32 as zlib's, whatever the split. ``mapped=True`` is
accepted and ignored."""
from __future__ import annotations

import os
import random
import zlib

import pytest

from supervisor.checkpoint.storage import fileio


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 7, (3 << 20) + 12345])
def test_the_ranged_checksum_is_zlibs_crc32_of_the_whole_file(tmp_path, monkeypatch, size):
    monkeypatch.setattr(fileio, "_PARALLEL_MIN_BYTES", 1 << 20)  # several ranges, odd boundaries
    data = random.Random(size).randbytes(size)
    path = tmp_path / "state.pt"
    path.write_bytes(data)
    expected = fileio.format_checksum(zlib.crc32(data))
    for workers in (1, 2, 3):
        assert fileio.checksum_file(str(path), mapped=True, max_workers=workers, chunk_bytes=1 << 19) == (size, expected)
    assert fileio.checksum_file(str(path)) == (size, expected)


def test_a_flipped_byte_changes_the_ranged_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio, "_PARALLEL_MIN_BYTES", 1 << 20)
    data = bytearray(random.Random(1).randbytes(3 << 20))
    path = tmp_path / "state.pt"
    path.write_bytes(bytes(data))
    before = fileio.checksum_file(str(path), mapped=True)
    data[len(data) // 2 + 1] ^= 0x10  # in the second thread's range
    path.write_bytes(bytes(data))
    assert fileio.checksum_file(str(path), mapped=True) != before
    assert os.path.getsize(path) == 3 << 20


def test_the_accelerated_crc32_is_zlibs_over_odd_lengths_and_start_values():
    # With the [fast] extra, fileio.crc32 is ISA-L's; the value must be zlib's exactly, or a
    # checkpoint written on one machine would fail verification on another.
    rng = random.Random(7)
    for size in (0, 1, 15, 16, 17, 63, 64, 65, 4095, 4096 + 3, (1 << 20) + 5):
        data = rng.randbytes(size)
        for start in (0, 1, 0xFFFFFFFF, rng.getrandbits(32)):
            assert fileio.crc32(data, start) == zlib.crc32(data, start), (size, start)
        assert fileio.crc32(memoryview(data)) == zlib.crc32(data)


def test_the_fast_extra_is_in_use_when_installed():
    try:
        import isal  # noqa: F401
    except ImportError:
        assert fileio.CRC32_IMPLEMENTATION == "zlib"
    else:
        assert fileio.CRC32_IMPLEMENTATION == "isal"


def test_a_checkpoint_written_with_one_crc32_restores_verified_with_the_other(tmp_path, monkeypatch):
    # Whether or not the [fast] extra is installed leaves nothing on disk to tell: save with
    # the stdlib's CRC-32, verify with the one in use, and the other way round.
    import torch

    from supervisor import TrainingState
    from supervisor.checkpoint.manager import CheckpointManager

    monkeypatch.setattr(fileio, "_PARALLEL_MIN_BYTES", 1 << 20)  # the mapped, threaded path too

    def save_and_restore(write_crc, read_crc, logdir):
        monkeypatch.setattr(fileio, "_crc32", write_crc)
        model = torch.nn.Linear(1024, 1024)  # 4 MiB
        with CheckpointManager(logdir) as manager:
            manager.save(3, TrainingState.from_arguments(model=model), wait=True)
        monkeypatch.setattr(fileio, "_crc32", read_crc)
        fresh = torch.nn.Linear(1024, 1024)
        with CheckpointManager(logdir, verify="full") as manager:
            assert manager.restore(TrainingState.from_arguments(model=fresh)).global_step == 3
        assert torch.equal(fresh.weight, model.weight)
        # and damage is still caught by the reading side's CRC-32
        (state_file,) = logdir.glob("model.ckpt-3/state.pt")
        data = bytearray(state_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        state_file.write_bytes(bytes(data))
        with CheckpointManager(logdir, verify="full") as manager:
            with pytest.raises(Exception, match="checksum|damaged|corrupt"):
                manager.restore(TrainingState.from_arguments(model=torch.nn.Linear(1024, 1024)))

    in_use = fileio._crc32
    save_and_restore(zlib.crc32, in_use, tmp_path / "a")
    save_and_restore(in_use, zlib.crc32, tmp_path / "b")
