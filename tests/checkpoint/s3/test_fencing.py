"""Fencing a writer that lost its lease, piece by piece (supervisor/checkpoint/layout/fencing.py, SPEC §16),
against the real moto server: a save's files under a root of its own, the manifest replaced only
over an older lease generation's, the index claimed by the new holder (also where there is none
yet), a manifest whose files were removed passed over, and the old layout still read.
tests/checkpoint/s3/test_stale_writer.py runs the whole story with real processes and signals."""
from __future__ import annotations

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

import torch  # noqa: E402

from supervisor import TrainingState  # noqa: E402
from supervisor.checkpoint import CheckpointManager, read_index  # noqa: E402
from supervisor.checkpoint.save.commit import serialize  # noqa: E402
from supervisor.checkpoint.layout.fencing import OrphanedManifestError, claim_index, index_generation  # noqa: E402
from supervisor.checkpoint.layout.format import make_payload  # noqa: E402
from supervisor.checkpoint.layout.index import CheckpointState, replace_index  # noqa: E402
from supervisor.checkpoint.ownership.lease import LeaseLostError  # noqa: E402
from supervisor.checkpoint.load.loader import verify_checkpoint  # noqa: E402
from supervisor.checkpoint.load.choose import find_and_load  # noqa: E402
from supervisor.checkpoint.storage import ObjectExistsError, PreconditionFailedError  # noqa: E402
from supervisor.checkpoint.save.temp import TempCheckpoint  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _payload(step: int, value: float) -> dict:
    return make_payload(step, {"model": {"w": torch.full((8,), value)}}, None, torch.__version__)


def _save(storage, logdir: str, step: int, value: float, generation: int | None):
    temp = TempCheckpoint.create(logdir, f"model.ckpt-{step}", storage, generation=generation)
    temp.write_file("state.pt", lambda w: serialize(_payload(step, value), w))
    return temp


def _value(storage, path: str) -> float:
    return float(find_and_load(path.rsplit("/", 1)[0], "model.ckpt", storage=storage).payload["model"]["w"][0])


def test_a_manifest_is_replaced_only_over_an_older_generation_and_the_replaced_files_are_removed(s3_storage, s3_root):
    logdir = s3_root + "/run"
    late = _save(s3_storage, logdir, 3, 1.0, generation=4)  # a paused writer's save, staged first
    new = _save(s3_storage, logdir, 3, 2.0, generation=7)   # the new holder's save of the same step
    assert late.path != new.path and late.path.startswith(f"{logdir}/model.ckpt-3/g0000000000000004-")

    late.finalize(step=3, wall_time=1.0, world_size=1)  # its manifest lands first
    assert s3_storage.exists(f"{new.path}/state.pt")  # its cleanup spares a newer generation's save in progress
    new.finalize(step=3, wall_time=2.0, world_size=1)   # replaced (If-Match), its files removed
    manifest = verify_checkpoint(f"{logdir}/model.ckpt-3", storage=s3_storage)
    assert (manifest.generation, manifest.root) == (7, new.root)
    assert s3_storage.list_files(f"{logdir}/model.ckpt-3") == ["MANIFEST.json", f"{new.root}/state.pt"]

    stale = _save(s3_storage, logdir, 3, 3.0, generation=5)  # an overtaken writer: refused, nothing written
    with pytest.raises(LeaseLostError, match=r"committed by a newer writer \(lease generation 7"):
        stale.finalize(step=3, wall_time=3.0, world_size=1)
    assert s3_storage.list_files(f"{logdir}/model.ckpt-3") == ["MANIFEST.json", f"{new.root}/state.pt"]
    assert verify_checkpoint(f"{logdir}/model.ckpt-3", storage=s3_storage).generation == 7


def test_the_new_holders_claim_fails_a_late_index_write_and_a_late_first_index(s3_storage, s3_root):
    logdir = s3_root + "/run"
    state = CheckpointState("model.ckpt-1", ("model.ckpt-1",), (1.0,))
    old = replace_index(logdir, state, storage=s3_storage, version=None, generation=3).version
    claimed = claim_index(s3_storage, logdir, "checkpoint", 5)
    assert read_index(logdir, s3_storage) == state and claimed != old
    assert index_generation(s3_storage.read_bytes(f"{logdir}/checkpoint").decode()) == 5
    with pytest.raises(PreconditionFailedError):  # the paused writer's If-Match names its own version
        replace_index(logdir, CheckpointState("model.ckpt-2"), storage=s3_storage, version=old, generation=3)
    assert read_index(logdir, s3_storage) == state

    fresh = s3_root + "/fresh"  # no index yet: the claim names only its writer, read as no index
    assert claim_index(s3_storage, fresh, "checkpoint", 5) is not None
    assert read_index(fresh, s3_storage) is None
    with pytest.raises(ObjectExistsError):  # the paused writer's first index is create-only
        replace_index(fresh, state, storage=s3_storage, version=None, generation=3)
    assert read_index(fresh, s3_storage) is None


def test_a_manifest_whose_files_were_removed_is_passed_over_not_counted_as_damage(s3_storage, s3_root):
    logdir = s3_root + "/run"
    _save(s3_storage, logdir, 1, 1.0, generation=2).finalize(step=1, wall_time=1.0, world_size=1)
    replace_index(logdir, CheckpointState("model.ckpt-1", ("model.ckpt-1",), (1.0,)), storage=s3_storage,
                  version=None, generation=2)
    late = _save(s3_storage, logdir, 2, 2.0, generation=2)
    s3_storage.remove_tree(late.path)  # the new holder removed it as an interrupted write's leftover,
    s3_storage.create_exclusive(f"{logdir}/model.ckpt-2/MANIFEST.json", _manifest_text(late, step=2))  # then it lands
    with pytest.raises(OrphanedManifestError):
        verify_checkpoint(f"{logdir}/model.ckpt-2", storage=s3_storage)
    s3_storage.remove(f"{logdir}/checkpoint")  # no index: restore looks at every committed checkpoint
    assert find_and_load(logdir, "model.ckpt", storage=s3_storage).step == 1  # no CheckpointCorruptError


def _manifest_text(temp: TempCheckpoint, *, step: int) -> bytes:
    from supervisor.checkpoint.layout.format import FileRecord, Manifest

    return Manifest(step=step, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                    files={"state.pt": FileRecord(10, "crc32:00000000")}, root=temp.root,
                    generation=temp.generation).to_json().encode()


def test_a_checkpoint_of_the_old_layout_restores_and_a_resave_replaces_it(s3_server, s3_storage, s3_root):
    logdir = s3_root + "/run"
    final = f"{logdir}/model.ckpt-1"
    old = TempCheckpoint(logdir, "model.ckpt-1", final, s3_storage)  # files beside the manifest (format 1)
    old.write_file("state.pt", lambda w: serialize(_payload(1, 1.0), w))
    old.finalize(step=1, wall_time=1.0, world_size=1)
    assert s3_storage.list_files(final) == ["MANIFEST.json", "state.pt"]
    assert verify_checkpoint(final, storage=s3_storage).root is None
    assert _value(s3_storage, final) == 1.0

    manager = CheckpointManager(logdir, storage_options=options(s3_server.endpoint), save_mode="sync")
    manager.open()
    try:
        state = TrainingState.from_arguments(model=torch.nn.Linear(2, 2))
        manager.save(1, state)  # the same step again: the new layout replaces it
    finally:
        manager.close()
    manifest = verify_checkpoint(final, storage=s3_storage)
    assert manifest.root and s3_storage.list_files(final) == ["MANIFEST.json", f"{manifest.root}/state.pt"]
