"""Reading a checkpoint once, from open descriptors (supervisor.checkpoint.load.loader, SPEC §5.5, §10.4)."""
from __future__ import annotations

import json
import os
import shutil
import zlib

import pytest
import torch

import supervisor.checkpoint.load.loader as loader
from supervisor.checkpoint.storage.fileio import format_checksum
from supervisor.checkpoint.load.loader import read_checkpoint
from supervisor.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError, CheckpointVanishedError

from tests.estimator.sidecar_helpers import StepTrainer, weight_of


@pytest.fixture
def trainer(tmp_path):
    t = StepTrainer(str(tmp_path / "run"), max_to_keep=None)
    yield t
    t.close()


def files_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def rewrite_manifest_for(path: str, name: str = "state.pt") -> None:
    """Makes the manifest match the file as it is now (so only deeper checks can object)."""
    manifest_path = os.path.join(path, "MANIFEST.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    with open(os.path.join(path, name), "rb") as f:
        data = f.read()
    manifest["files"][name] = {"bytes": len(data), "checksum": format_checksum(zlib.crc32(data))}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def test_reads_the_payload_once_bytes_read_equals_size(trainer):
    path = trainer.save(3)
    ckpt = read_checkpoint(path)
    assert ckpt.step == 3 and ckpt.path == path
    assert torch.equal(ckpt.payload["model"]["1.bias"], torch.full((1,), weight_of(3)))
    assert ckpt.bytes_read == files_size(path)  # every byte once: manifest + state.pt
    assert not ckpt.deleted_while_reading


def test_retention_deleting_after_the_files_are_open_cannot_pull_bytes_away(trainer, monkeypatch):
    """The core property: once opened, the checkpoint is read whole even if retention renames
    it aside and deletes it (POSIX keeps an open file's inode)."""
    path = trainer.save(5)
    real_open_listed = loader._open_listed

    def open_then_retention(snapshot, p, manifest):
        real_open_listed(snapshot, p, manifest)
        aside = p + ".deleting-" + "0" * 32
        os.rename(p, aside)
        shutil.rmtree(aside)

    monkeypatch.setattr(loader, "_open_listed", open_then_retention)
    ckpt = read_checkpoint(path)
    assert not os.path.exists(path)
    assert ckpt.step == 5 and ckpt.deleted_while_reading
    assert all(torch.all(t == weight_of(5)) for t in ckpt.payload["model"].values())


def test_deleted_after_the_directory_opened_but_before_its_files_is_vanished(trainer, monkeypatch):
    path = trainer.save(5)
    real_open_in = loader._open_in

    def retention_first(snapshot, p, name):
        if name == "state.pt":  # the manifest was read; retention deletes the rest now
            aside = p + ".deleting-" + "1" * 32
            os.rename(p, aside)
            shutil.rmtree(aside)
        return real_open_in(snapshot, p, name)

    monkeypatch.setattr(loader, "_open_in", retention_first)
    with pytest.raises(CheckpointVanishedError, match="deleted while being opened"):
        read_checkpoint(path)


def test_a_missing_checkpoint_is_vanished_and_a_not_found_error(tmp_path):
    with pytest.raises(CheckpointVanishedError) as info:
        read_checkpoint(str(tmp_path / "model.ckpt-9"))
    assert isinstance(info.value, CheckpointNotFoundError)


def test_missing_manifest_in_a_present_directory_is_corrupt(trainer):
    path = trainer.save(1)
    os.remove(os.path.join(path, "MANIFEST.json"))
    with pytest.raises(CheckpointCorruptError, match="MANIFEST.json is missing"):
        read_checkpoint(path)


def test_missing_state_file_in_a_present_directory_is_corrupt(trainer):
    path = trainer.save(1)
    os.remove(os.path.join(path, "state.pt"))
    with pytest.raises(CheckpointCorruptError, match="state.pt is missing"):
        read_checkpoint(path)


def test_bit_flip_is_corrupt_and_size_mode_only_checks_sizes(trainer):
    path = trainer.save(1)
    state = os.path.join(path, "state.pt")
    with open(state, "r+b") as f:
        f.seek(os.path.getsize(state) - 30)  # inside the zip directory: load may still work
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CheckpointCorruptError, match="checksum crc32:[0-9a-f]{8} does not match"):
        read_checkpoint(path)


def test_files_of_two_checkpoints_mixed_are_refused(trainer):
    """A state.pt of step 1 inside checkpoint 2, with a manifest made to match: refused."""
    one, two = trainer.save(1), trainer.save(2)
    shutil.copyfile(os.path.join(one, "state.pt"), os.path.join(two, "state.pt"))
    rewrite_manifest_for(two)
    with pytest.raises(CheckpointCorruptError, match="of step 1, the manifest says 2"):
        read_checkpoint(two)


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/supervisor-sidecar-pwned",))


def test_a_malicious_pickle_is_refused_and_never_run(trainer):
    path = trainer.save(1)
    marker = "/tmp/supervisor-sidecar-pwned"
    if os.path.exists(marker):
        os.remove(marker)
    torch.save({"global_step": 1, "model": Evil()}, os.path.join(path, "state.pt"))
    rewrite_manifest_for(path)
    with pytest.raises(CheckpointError, match="posix.system|os.system|GLOBAL"):
        read_checkpoint(path)
    assert not os.path.exists(marker)


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_corrupt(trainer):
    path = trainer.save(1)
    manifest_path = os.path.join(path, "MANIFEST.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["files"]["../checkpoint"] = {"bytes": 1, "checksum": "crc32:00000000"}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(CheckpointCorruptError, match="not a file of the checkpoint"):
        read_checkpoint(path)


def test_bad_verify_mode_is_a_value_error(trainer):
    with pytest.raises(ValueError, match="verify must be one of 'full', 'size', got 'none'"):
        read_checkpoint(trainer.save(1), verify="none")


def test_a_sharded_checkpoint_with_unreadable_metadata_is_corrupt(trainer):
    """A manifest naming DCP's files is read as a sharded checkpoint (tests/estimator/
    test_sidecar_dcp.py reads real ones); an empty ``.metadata`` is damage, named."""
    path = trainer.save(1)
    os.rename(os.path.join(path, "state.pt"), os.path.join(path, "__0_0.distcp"))
    (open(os.path.join(path, ".metadata"), "wb")).close()
    manifest_path = os.path.join(path, "MANIFEST.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["files"] = {"__0_0.distcp": manifest["files"]["state.pt"],
                         ".metadata": {"bytes": 0, "checksum": "crc32:00000000"}}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)
    with pytest.raises(CheckpointCorruptError, match=r"model.ckpt-1: .metadata cannot be read"):
        read_checkpoint(path)
