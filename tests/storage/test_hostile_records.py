"""Hostile JSON records in a logdir (issue 30 item 4), local and on a real S3-compatible server:
``"[" * 200000`` (deeper than the parser recurses), bytes that are not UTF-8, a JSON value that is
not an object, numbers too large for a float and fields of the wrong type, as a checkpoint
manifest, the index, a lease record, the finished mark, the lock's owner record, an export's
eval record, its manifest and its safetensors header. Each is "damaged: why": a restore falls
back to the previous checkpoint with a WARNING, ``ls``/``verify``/``inspect`` list it as not
verified and go on, the other readers say so with a WARNING or return "none" — never a
`RecursionError`, `OverflowError` or traceback."""
from __future__ import annotations

import json
import logging
import struct

import pytest
import torch

from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.layout.finished import finished_path, read_finished
from supervisor.checkpoint.layout.format import FORMAT_NAME, FORMAT_VERSION
from supervisor.checkpoint.ownership.lease import LEASE_DIR, Lease
from supervisor.checkpoint.ownership.lock import OWNER_FILE, OwnershipLock
from supervisor.checkpoint.storage import resolve_location
from supervisor.cli import main
from supervisor.cli._common import writer_note
from supervisor.errors import LogdirInUseError
from supervisor.estimator.export.files import export_step, read_export_record
from supervisor.estimator.training import exported_steps
from tests.s3_fixtures import make_bucket

pytestmark = pytest.mark.timeout(120)

HUGE = 10 ** 400  # a JSON integer Python parses, but no float holds


def _valid_manifest() -> dict:
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "step": 3, "wall_time": 1.0,
            "torch_version": "2.13.0", "world_size": 1, "files": {"state.pt": {"bytes": 1, "checksum": "crc32:0"}}}


def _payloads(valid: dict, keep: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Hostile contents of a record whose valid form is ``valid`` (``keep``: keys left valid, so
    the reader gets as far as the fields)."""
    def each(value):
        return json.dumps({k: (v if k in keep else value) for k, v in valid.items()}).encode()
    return {"nested": b"[" * 200_000, "nested object": b'{"a": ' * 100_000, "not utf-8": b"\xff\xfe{\x00}",
            "not an object": b"[1, 2, 3]", "huge numbers": each(HUGE), "lists": each([[1]]),
            "objects": each({"x": {}}), "missing fields": json.dumps({k: valid[k] for k in keep}).encode()}


MANIFESTS = _payloads(_valid_manifest(), keep=("format", "format_version"))
LEASES = _payloads({"generation": 1, "owner_id": "x", "host": "h", "pid": 1, "acquired_at": 1.0,
                    "expires_at": 2.0, "lease_secs": 1.0})
FINISHED = _payloads({"step": 1, "checkpoint": "model.ckpt-1", "wall_time": 1.0, "host": "h", "pid": 1})
del FINISHED["missing fields"]  # every field of a finished mark is optional: {} is a valid one
RECORDS = _payloads({"global_step": 3, "checkpoint_path": "x", "metrics": {"loss": 1.0}})
INDEX = {"nested": b"[" * 200_000, "not utf-8": b"\xff\xfe", "huge number": b"last_preserved_timestamp: 1" + b"0" * 400}


@pytest.fixture
def where(backend_logdir):
    """``(storage, logdir, storage_options)`` of each backend (`tests.s3_fixtures.backend_logdir`)."""
    return backend_logdir


def _state(seed: int) -> TrainingState:
    torch.manual_seed(seed)
    return TrainingState.from_arguments(model=torch.nn.Linear(4, 2))


@pytest.fixture
def three(where):
    """Checkpoints of steps 1, 2, 3 in the logdir; returns ``where``."""
    storage, logdir, opts = where
    with CheckpointManager(logdir, storage_options=opts, save_mode="sync", max_to_keep=None) as manager:
        for step in (1, 2, 3):
            manager.save(step, _state(step))
    return where


def _cli(*argv: str, opts) -> list[str]:
    return [*argv, "--json", *(["--storage-options", json.dumps(opts)] if opts else [])]


@pytest.mark.parametrize("name", list(MANIFESTS))
def test_a_hostile_manifest_is_damaged_for_restore_and_the_cli(three, name, caplog, capsys):
    storage, logdir, opts = three
    newest = storage.join(logdir, "model.ckpt-3")
    storage.write_atomic(storage.join(newest, "MANIFEST.json"), MANIFESTS[name])
    state = _state(99)
    with caplog.at_level(logging.WARNING), CheckpointManager(logdir, storage_options=opts) as manager:
        restored = manager.restore(state)
    assert restored.global_step == 2 and torch.equal(state["model"].weight, _state(2)["model"].weight)
    assert any("model.ckpt-3" in r.getMessage() and "trying the next older one" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING), caplog.text
    for command in ("ls", "verify"):
        code = main(_cli(command, logdir, opts=opts))
        out, err = capsys.readouterr()
        rows = {row["step"]: row for row in json.loads(out)}
        assert code == 1 and "Traceback" not in err, (command, err)
        assert [rows[s]["verified"] for s in (1, 2)] == [True, True], rows
        assert rows.get(3, {"verified": False})["verified"] is False
    code = main(_cli("inspect", newest, opts=opts))
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err, err
    assert json.loads(out)["verified"] is False and "MANIFEST.json" in json.loads(out)["reason"]


@pytest.mark.parametrize("name", list(INDEX))
def test_a_hostile_index_restores_the_newest_checkpoint_with_a_warning(three, name, caplog, capsys):
    storage, logdir, opts = three
    storage.write_atomic(storage.join(logdir, "checkpoint"), INDEX[name])
    with caplog.at_level(logging.WARNING), CheckpointManager(logdir, storage_options=opts) as manager:
        assert manager.restore(_state(99)).global_step == 3
    assert "checkpoint index" in caplog.text
    assert main(_cli("ls", logdir, opts=opts)) in (0, 1)
    out, err = capsys.readouterr()
    assert "Traceback" not in err and [r["step"] for r in json.loads(out)] == [1, 2, 3]


@pytest.mark.parametrize("name", list(LEASES))
def test_a_hostile_lease_record_is_an_unknown_holder(where, name, caplog):
    storage, logdir, _ = where
    storage.makedirs(storage.join(logdir, LEASE_DIR))
    storage.write_atomic(storage.join(logdir, LEASE_DIR, f"{1:016d}.json"), LEASES[name])
    with caplog.at_level(logging.WARNING):
        holder = Lease(storage, logdir).newest()
    assert holder is not None and holder.generation == 1 and holder.host == "unknown"
    assert "is unreadable" in caplog.text


@pytest.mark.parametrize("name", list(FINISHED))
def test_a_hostile_finished_mark_is_damaged(where, name, caplog):
    storage, logdir, _ = where
    storage.makedirs(logdir)
    storage.write_atomic(finished_path(logdir, storage), FINISHED[name])
    with caplog.at_level(logging.WARNING):
        mark = read_finished(logdir, storage)
    assert mark is not None and mark.step is None  # finished, nothing known about it
    assert "is damaged" in caplog.text or "cannot be read" in caplog.text


@pytest.mark.parametrize("name", ["nested", "not utf-8", "huge numbers", "lists"])
def test_a_hostile_lock_owner_record_is_unknown(tmp_path, name, capsys):
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    holder = OwnershipLock(str(logdir))
    holder.acquire()
    try:
        (logdir / OWNER_FILE).write_bytes(LEASES[name])
        assert writer_note(str(logdir)) is None
        assert main(["ls", str(logdir)]) == 0, capsys.readouterr().err
        with pytest.raises(LogdirInUseError, match="pid and host unknown"):
            OwnershipLock(str(logdir)).acquire()
    finally:
        holder.release()
    assert not holder.held


@pytest.mark.parametrize("name", list(RECORDS))
def test_a_hostile_export_record_counts_as_no_export(where, name, caplog):
    storage, logdir, opts = where
    base = storage.join(logdir, "export", "best")
    for version, data in (("1", json.dumps({"global_step": 1, "checkpoint_path": "x", "metrics": {}}).encode()),
                          ("2", RECORDS[name])):
        storage.makedirs(storage.join(base, version))
        storage.write_atomic(storage.join(base, version, "eval_result.json"), data)
        storage.write_atomic(storage.join(base, version, "MANIFEST.json"), b"{}")  # complete on an object store
    with caplog.at_level(logging.WARNING):
        assert read_export_record(resolve_location(storage.join(base, "2"), opts)) is None
    assert "ignoring the export record" in caplog.text
    assert exported_steps(resolve_location(base, opts)) == {1}


@pytest.mark.parametrize("name", ["nested", "not utf-8", "not an object", "huge numbers", "lists"])
def test_a_hostile_safetensors_header_has_no_step(where, name):
    storage, logdir, opts = where
    header = {"nested": b"[" * 200_000, "not utf-8": b"\xff\xfe", "not an object": b"[]",
              "huge numbers": b'{"__metadata__": {"global_step": 1e400}}',  # inf: no int holds it
              "lists": json.dumps({"__metadata__": [[1]]}).encode()}[name]
    directory = storage.join(logdir, "export", "1")
    storage.makedirs(directory)
    storage.write_atomic(storage.join(directory, "model.safetensors"), struct.pack("<Q", len(header)) + header)
    assert export_step(resolve_location(directory, opts)) is None


def test_a_hostile_export_manifest_is_not_deleted(s3_storage):
    from supervisor.estimator.export.objects import delete_object_export

    base = make_bucket(s3_storage) + "/export/best"
    for version, (name, data) in enumerate(MANIFESTS.items(), 1):
        path = s3_storage.join(base, str(version))
        s3_storage.write_atomic(s3_storage.join(path, "model.pt"), b"weights")
        s3_storage.write_atomic(s3_storage.join(path, "MANIFEST.json"), data)
        assert delete_object_export(s3_storage, path) is False, name
        assert s3_storage.exists(s3_storage.join(path, "model.pt")), name
