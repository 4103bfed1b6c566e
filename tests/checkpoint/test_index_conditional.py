"""The index is replaced only while it still is the version the writer read or last wrote (SPEC
§16), locally too: an index another process moved makes the save fail loudly, and retention then
deletes nothing (the same rule tests/checkpoint/s3 checks against a real object store)."""
from __future__ import annotations

import os

import pytest

from supervisor.checkpoint.save.commit import clean_transient
from supervisor.errors import CheckpointError
from tests.checkpoint.conftest import small_state

pytestmark = pytest.mark.timeout(60)


def test_an_index_moved_by_another_process_fails_the_save_and_deletes_nothing(manager_factory, tmp_path):
    manager = manager_factory(max_to_keep=1, save_mode="sync")
    state = small_state()
    manager.save(1, state)
    index = tmp_path / "logdir" / "checkpoint"
    other = 'model_checkpoint_path: "model.ckpt-1"\n# rewritten by another writer\n'
    index.write_text(other)

    with pytest.raises(CheckpointError, match=r"the index .*checkpoint could not be updated.*changed since it was read"):
        manager.save(2, state)
    assert index.read_text() == other
    assert os.path.isfile(tmp_path / "logdir" / "model.ckpt-1" / "MANIFEST.json")  # retention deleted nothing


def test_clean_transient_leaves_a_manifest_less_checkpoint_directory_alone_locally(tmp_path):
    """Locally a checkpoint is renamed into place whole, so a ``<basename>-<step>`` directory
    without a manifest is someone's (damaged, hand-made): never removed; only temp names are."""
    (tmp_path / "model.ckpt-3").mkdir()
    (tmp_path / "model.ckpt-3" / "state.pt").write_bytes(b"x")
    (tmp_path / "model.ckpt-4.tmp-" f"{'0' * 32}").mkdir()
    assert clean_transient(str(tmp_path), basename="model.ckpt") == ["model.ckpt-4.tmp-" + "0" * 32]
    assert os.listdir(tmp_path) == ["model.ckpt-3"]
