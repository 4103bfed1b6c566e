"""``prune --keep N`` keeps the newest N checkpoints that verify *and load* under the allowlist
(issue 30 item 5), local and on a real S3-compatible server: a forged, checksum-valid newest
checkpoint reducing to ``os.system`` (the index pointing at it) is no longer counted as one of
the N, so the newest loadable checkpoints survive; nothing in it ever runs."""
from __future__ import annotations

import io
import json
import os
from dataclasses import replace

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager, load_checkpoint, read_index, write_index
from supervisor.checkpoint.storage.fileio import crc32
from supervisor.checkpoint.layout.format import FileRecord, Manifest
from supervisor.cli import main

pytestmark = pytest.mark.timeout(120)


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.fixture
def where(backend_logdir):
    """``(storage, logdir, storage_options)`` of each backend (`tests.s3_fixtures.backend_logdir`)."""
    return backend_logdir


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    return TrainingState.from_arguments(model=torch.nn.Linear(4, 2))


def _plant_malicious(storage, logdir: str, step: int, marker: str) -> None:
    """A committed-looking checkpoint ``step`` (its manifest's checksum valid) reducing to
    ``os.system``, listed last in the index, which points at it."""
    buffer = io.BytesIO()
    torch.save({"global_step": step, "model": _System(f"touch {marker}")}, buffer)
    data = buffer.getvalue()
    path = storage.join(logdir, f"model.ckpt-{step}")
    storage.makedirs(path)
    storage.write_atomic(storage.join(path, "state.pt"), data)
    manifest = Manifest(step=step, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                        files={"state.pt": FileRecord(len(data), f"crc32:{crc32(data) & 0xFFFFFFFF:08x}")})
    storage.write_atomic(storage.join(path, "MANIFEST.json"), manifest.to_json().encode())
    index = read_index(logdir, storage)
    name = index.all_model_checkpoint_paths[-1].replace(f"-{step - 1}", f"-{step}")
    write_index(logdir, replace(index, model_checkpoint_path=name,
                                all_model_checkpoint_paths=(*index.all_model_checkpoint_paths, name),
                                all_model_checkpoint_timestamps=(*index.all_model_checkpoint_timestamps, 1e9)), storage)


@pytest.mark.parametrize("keep, survivors", [(1, [3, 4]), (2, [2, 3, 4])])
def test_prune_keeps_the_newest_loadable_checkpoints(where, tmp_path, capsys, keep, survivors):
    storage, logdir, opts = where
    with CheckpointManager(logdir, storage_options=opts, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
    marker = tmp_path / "pwned"
    _plant_malicious(storage, logdir, 4, str(marker))
    argv = ["prune", logdir, "--keep", str(keep), *(["--storage-options", json.dumps(opts)] if opts else [])]
    assert main(argv) == 0
    out = capsys.readouterr().out
    present = sorted(s for s in (1, 2, 3, 4) if storage.exists(storage.join(logdir, f"model.ckpt-{s}", "MANIFEST.json")))
    assert present == survivors, out
    assert "model.ckpt-4" in out and "may be malicious" in out, out
    newest_loadable = load_checkpoint(storage.join(logdir, "model.ckpt-3"), storage_options=opts)
    assert newest_loadable["global_step"] == 3
    assert torch.equal(newest_loadable["model"]["weight"], _state(3)["model"].weight)
    assert not marker.exists()
