"""Per-item checksums of sharded checkpoints (issue 31, `supervisor.checkpoint.formats.dcp_ranges`), in
one process: computed while DCP writes (the stretches between its ``tell()`` calls), kept in
``.metadata``, checked on exactly the items a restore reads; the chief's choice reads no shard."""
from __future__ import annotations

import os
import time
import zlib

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystem

from supervisor import TrainingState
from supervisor.checkpoint.sharded import restore_sharded, save_sharded
from supervisor.checkpoint.formats.dcp_ranges import _RecordingFileSystem, verifiable_by_ranges
from supervisor.checkpoint.formats.dcp_reading import read_metadata_file
from supervisor.checkpoint.sharded.restore import choose_sharded
from supervisor.checkpoint.layout.format import read_manifest
from supervisor.errors import CheckpointCorruptError

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(120)]


def test_an_item_split_by_extra_tell_calls_gets_the_crc_of_its_bytes(tmp_path):
    fs = _RecordingFileSystem(FileSystem())
    with fs.create_stream(str(tmp_path / "f.distcp"), "wb") as stream:
        assert stream.tell() == 0
        stream.write(b"abc")
        stream.write(memoryview(torch.arange(4, dtype=torch.float32).numpy()))  # a non-byte buffer
        assert stream.tell() == 19
        stream.write(b"de")
        assert stream.tell() == 21  # inside the second item
        stream.write(b"fgh")
    data = (tmp_path / "f.distcp").read_bytes()
    assert len(data) == 24 and fs.written["f.distcp"].crc == zlib.crc32(data)
    assert fs.item_crc("f.distcp", 0, 19) == zlib.crc32(data[:19])
    assert fs.item_crc("f.distcp", 19, 5) == zlib.crc32(data[19:])  # two stretches combined
    assert fs.item_crc("f.distcp", 1, 5) is None  # not an item boundary: verified with its file


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    return TrainingState.from_arguments(model=torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)))


def test_a_flipped_byte_in_an_item_is_caught_by_the_reader_and_the_chief_reads_no_shard(tmp_path):
    saved = _state(0)
    path = save_sharded(str(tmp_path), "model.ckpt", 1, saved, wall_time=time.time())
    assert verifiable_by_ranges(read_metadata_file(path))
    manifest = read_manifest(path)
    shard = os.path.join(path, "__0_0.distcp")
    assert manifest.files["__0_0.distcp"].checksum == f"crc32:{zlib.crc32(open(shard, 'rb').read()):08x}"
    restored = _state(1)
    restore_sharded(path, restored, step=1, manifest=manifest)
    assert all(torch.equal(a, b) for a, b in zip(saved["model"].state_dict().values(),
                                                   restored["model"].state_dict().values()))
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x80]))
    chosen = choose_sharded(str(tmp_path), "model.ckpt")  # sizes and .metadata only: still chosen
    assert chosen is not None and chosen[0] == path
    with pytest.raises(CheckpointCorruptError, match=r"__0_0\.distcp \(one item\) have checksum"):
        restore_sharded(path, _state(2), step=1, manifest=manifest)
