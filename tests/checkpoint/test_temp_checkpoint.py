"""`TempCheckpoint`: several writers fill one temp directory, one process seals and commits it;
the serialisation fast path falls back to ``torch.save`` loudly."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from supervisor.checkpoint.formats import serialize as serialize_module
from supervisor.checkpoint import verify_checkpoint
from supervisor.checkpoint.storage.fileio import ChecksumWriter, checksum_file, default_opener
from supervisor.checkpoint.layout.format import read_manifest
from supervisor.checkpoint.save.temp import TempCheckpoint


def _write_raw(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def test_two_writers_one_seal(tmp_path):
    chief = TempCheckpoint.create(str(tmp_path), "model.ckpt-5")
    other = TempCheckpoint.attach(chief.path)  # e.g. rank 1, given the broadcast path
    assert other.name == "model.ckpt-5" and other.directory == str(tmp_path)
    record = other.write_file("__1_0.distcp", lambda w: w.write(b"rank one" * 100))
    chief.add_record("__1_0.distcp", record)  # gathered from rank 1
    chief.write_file("__0_0.distcp", lambda w: w.write(b"rank zero"))
    _write_raw(os.path.join(chief.path, ".metadata"), b"written by a library")  # nobody recorded it
    result = chief.finalize(step=5, wall_time=1.0, world_size=2)

    assert result.path == str(tmp_path / "model.ckpt-5")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    manifest = read_manifest(result.path)
    assert sorted(manifest.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name, rec in manifest.files.items():
        assert (rec.size, rec.checksum) == checksum_file(os.path.join(result.path, name))
    assert manifest.world_size == 2 and manifest.step == 5


def test_seal_refuses_a_file_whose_size_changed_after_it_was_recorded(tmp_path):
    temp = TempCheckpoint.create(str(tmp_path), "model.ckpt-1")
    temp.write_file("a.bin", lambda w: w.write(b"12345"))
    _write_raw(os.path.join(temp.path, "a.bin"), b"123")  # torn by someone else
    with pytest.raises(OSError, match="a.bin has 3 bytes"):
        temp.finalize(step=1, wall_time=0.0, world_size=1)
    assert os.listdir(tmp_path) == []  # temp removed, nothing committed


def test_seal_refuses_a_recorded_file_that_is_missing(tmp_path):
    temp = TempCheckpoint.create(str(tmp_path), "model.ckpt-1")
    temp.add_record("__1_0.distcp", _record(7))
    with pytest.raises(OSError, match="missing"):
        temp.finalize(step=1, wall_time=0.0, world_size=2)
    assert os.listdir(tmp_path) == []


def _record(size: int):
    from supervisor.checkpoint.layout.format import FileRecord

    return FileRecord(size, "crc32:00000000")


def test_attach_rejects_a_path_that_is_not_a_temp_dir(tmp_path):
    with pytest.raises(ValueError, match="not a checkpoint temp directory"):
        TempCheckpoint.attach(str(tmp_path / "model.ckpt-3"))


def test_serializer_falls_back_to_torch_save_with_a_warning(monkeypatch, caplog, tmp_path):
    def broken(obj, f):
        raise AttributeError("PyTorchFileWriter moved")

    monkeypatch.setattr(serialize_module, "_save_without_record_crc", broken)
    serialize_module._resolve_serializer.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="supervisor.checkpoint.formats.serialize"):
            path = str(tmp_path / "state.pt")
            with ChecksumWriter(default_opener(path)) as writer:
                serialize_module.serialize({"x": torch.arange(4)}, writer)
                writer.sync()
        assert any("plain torch.save" in r.getMessage() and r.levelno == logging.WARNING
                   for r in caplog.records)
        assert torch.equal(torch.load(path, weights_only=True)["x"], torch.arange(4))
    finally:
        serialize_module._resolve_serializer.cache_clear()


def test_write_checkpoint_still_verifies(manager_factory):
    from .conftest import small_state

    manager = manager_factory()
    path = manager.save(3, small_state(), wait=True)
    assert verify_checkpoint(path).files.keys() == {"state.pt"}
