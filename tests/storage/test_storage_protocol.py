"""The `Storage` protocol, the same tests on both backends: a local directory and a bucket of a
real S3-compatible server (moto over HTTP, the real s3fs/botocore client)."""
from __future__ import annotations

import builtins
import os
import threading
import zlib

import pytest

from supervisor.checkpoint.storage import (LocalStorage, ObjectExistsError, PreconditionFailedError,
                                           SnapshotVanishedError, Storage, storage_for)

pytestmark = pytest.mark.timeout(60)


def test_both_backends_satisfy_the_protocol(backend):
    storage, _ = backend
    assert isinstance(storage, Storage)


def test_create_exclusive_is_refused_on_an_existing_object(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "lease.json")
    storage.create_exclusive(path, b"first")
    with pytest.raises(ObjectExistsError, match="already exists"):
        storage.create_exclusive(path, b"second")
    assert storage.read_bytes(path) == b"first"


def test_replace_if_is_refused_after_another_writer_moved_the_object(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "checkpoint")
    storage.write_atomic(path, b"index v1")
    data, seen = storage.read_versioned(path)
    assert data == b"index v1"
    storage.write_atomic(path, b"index moved by another writer")
    with pytest.raises(PreconditionFailedError):
        storage.replace_if(path, b"index v2", seen.version)
    assert storage.read_bytes(path) == b"index moved by another writer"
    _, current = storage.read_versioned(path)
    storage.replace_if(path, b"index v2", current.version)
    assert storage.read_bytes(path) == b"index v2"
    with pytest.raises(FileNotFoundError):
        storage.replace_if(storage.join(root, "missing"), b"x", current.version)


def test_reads_whole_ranged_and_bounded(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "blob")
    payload = bytes(range(256)) * 40
    storage.write_atomic(path, payload)
    assert storage.read_bytes(path) == payload
    assert storage.read_range(path, 100, 50) == payload[100:150]
    assert storage.read_range(path, len(payload) - 3, 10) == payload[-3:]
    assert storage.read_range(path, 5, 0) == b""
    assert storage.stat(path).size == len(payload)
    with pytest.raises(OSError, match="more than"):
        storage.read_bytes(path, max_bytes=100)
    with storage.open_read(path) as f:
        f.seek(1000)
        assert f.read(10) == payload[1000:1010]
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "missing"))
    with pytest.raises(FileNotFoundError):
        storage.stat(storage.join(root, "missing"))


def test_listing_and_removing_a_prefix(backend):
    storage, root = backend
    for rel in ("ckpt-1/a", "ckpt-1/sub/b", "ckpt-2/a", "checkpoint"):
        path = storage.join(root, *rel.split("/"))
        storage.makedirs(storage.dirname(path))
        storage.write_atomic(path, rel.encode())
    assert storage.listdir(root) == ["checkpoint", "ckpt-1", "ckpt-2"]
    assert storage.list_files(storage.join(root, "ckpt-1")) == ["a", "sub/b"]
    assert storage.isdir(storage.join(root, "ckpt-1")) and not storage.isdir(storage.join(root, "checkpoint"))
    storage.remove_tree(storage.join(root, "ckpt-1"))
    assert storage.listdir(root) == ["checkpoint", "ckpt-2"]
    assert storage.remove(storage.join(root, "checkpoint")) is True
    assert storage.remove(storage.join(root, "checkpoint")) is False
    assert storage.listdir(root) == ["ckpt-2"]


def test_open_write_checksums_while_writing_and_appears_only_when_synced(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "state.pt")
    data = os.urandom(3 << 20)
    with storage.open_write(path) as writer:
        for start in range(0, len(data), 700_000):
            writer.write(memoryview(data)[start:start + 700_000])
        assert not storage.exists(path) or isinstance(storage, LocalStorage)  # an upload shows nothing yet
        writer.sync()
    assert writer.nbytes == len(data)
    assert writer.checksum == f"crc32:{zlib.crc32(data):08x}"
    assert storage.read_bytes(path) == data

    abandoned = storage.join(root, "abandoned")
    w = storage.open_write(abandoned)
    w.write(b"partial")
    w.close()
    assert not storage.exists(abandoned)


@pytest.mark.parametrize("size", [10, 6 << 20])
def test_open_write_never_overwrites_an_existing_file(backend, size):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "state.pt")
    storage.write_atomic(path, b"committed bytes")
    if not isinstance(storage, LocalStorage):
        storage = type(storage)(storage.fs, part_size=5 << 20)  # 6 MiB: a multipart upload
    with pytest.raises(FileExistsError):
        with storage.open_write(path) as writer:  # local: refused here; S3: when completed
            writer.write(b"x" * size)
            writer.sync()
    assert storage.read_bytes(path) == b"committed bytes"


def test_stage_commit_discard(backend):
    storage, root = backend
    storage.makedirs(root)
    final = storage.join(root, "model.ckpt-5")
    staged = storage.stage(root, "model.ckpt-5")
    w = storage.open_write(storage.join(staged, "state.pt"))
    w.write(b"tensor bytes")
    w.sync()
    w.close()
    storage.commit(staged, final, manifest_name="MANIFEST.json", manifest=b"{}")
    assert storage.list_files(final) == ["MANIFEST.json", "state.pt"]
    assert [n for n in storage.listdir(root) if "tmp" in n] == []

    other = storage.stage(root, "model.ckpt-6")
    w = storage.open_write(storage.join(other, "state.pt"))
    w.write(b"x")
    w.sync()
    w.close()
    storage.discard(other)
    assert storage.listdir(root) == ["model.ckpt-5"]


def test_storage_for_picks_by_scheme_and_names_what_is_missing(tmp_path, monkeypatch):
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    with pytest.raises(ValueError, match=r"'gs://bucket/x'.*scheme 'gs'"):
        storage_for("gs://bucket/x")
    with pytest.raises(ValueError, match="object-store URLs only"):
        storage_for(str(tmp_path), {"anon": True})

    real_import = builtins.__import__

    def no_s3fs(name, *args, **kwargs):
        if name == "s3fs" or name.startswith("s3fs."):
            raise ModuleNotFoundError("No module named 's3fs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(__import__("sys").modules, "supervisor.checkpoint.object_store", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(ImportError, match=r"s3://bucket/run.*pip install \"torch-supervisor\[s3\]\""):
        storage_for("s3://bucket/run")


def test_local_reads_refuse_a_fifo_without_blocking(tmp_path):
    storage = LocalStorage()
    fifo = str(tmp_path / "checkpoint")
    os.mkfifo(fifo)
    result: list[BaseException] = []

    def read() -> None:
        try:
            storage.read_bytes(fifo)
        except BaseException as e:  # noqa: BLE001 - inspected below
            result.append(e)

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], OSError) and "not a regular file" in str(result[0])


def test_local_create_exclusive_never_shows_a_partial_file(tmp_path):
    storage = LocalStorage()
    path = str(tmp_path / "lease")
    storage.create_exclusive(path, b"x" * 100_000)
    assert os.path.getsize(path) == 100_000
    assert os.listdir(tmp_path) == ["lease"]  # the temp file it was linked from is gone


def _checkpoint(storage, root, name="model.ckpt-7", files=None):
    files = files or {"MANIFEST.json": b"{}", "state.pt": os.urandom(300_000)}
    directory = storage.join(root, name)
    storage.makedirs(directory)
    for rel, data in files.items():
        storage.write_atomic(storage.join(directory, rel), data)
    return directory, files


def test_a_snapshot_opens_every_file_before_reading_and_reads_them_whole(backend):
    storage, root = backend
    directory, files = _checkpoint(storage, root)
    with pytest.raises(FileNotFoundError, match="missing.pt is missing"):
        storage.open_snapshot(directory, ["state.pt", "missing.pt"])
    with pytest.raises(SnapshotVanishedError):
        storage.open_snapshot(storage.join(root, "model.ckpt-99"), ["state.pt"])
    with pytest.raises(ValueError, match="not a file name"):
        storage.open_snapshot(directory, ["../state.pt"])
    snapshot = storage.open_snapshot(directory, files)
    try:
        assert snapshot.sizes == {k: len(v) for k, v in files.items()}
        buffer = bytearray(len(files["state.pt"]))
        view = memoryview(buffer)
        got = 0
        while got < len(buffer):
            n = snapshot.files["state.pt"].readinto(view[got:got + 65536])
            assert n
            got += n
        assert bytes(buffer) == files["state.pt"]
        assert not snapshot.vanished()
    finally:
        snapshot.close()


def test_a_snapshot_notices_the_checkpoint_deleted_underneath_it(backend):
    """Retention deletes a checkpoint an evaluator is reading: locally the open descriptors still
    read it whole; on an object store the reads fail cleanly (deleted: FileNotFoundError) and
    ``vanished()`` says why either way."""
    storage, root = backend
    directory, files = _checkpoint(storage, root)
    snapshot = storage.open_snapshot(directory, ["state.pt"])
    try:
        storage.remove_tree(directory)
        assert snapshot.vanished()
        if isinstance(storage, LocalStorage):
            assert snapshot.files["state.pt"].read() == files["state.pt"]
        else:
            with pytest.raises(FileNotFoundError):
                snapshot.files["state.pt"].read(10)
    finally:
        snapshot.close()


def test_a_snapshot_never_mixes_two_versions_of_a_file(s3_storage, s3_root):
    directory, files = _checkpoint(s3_storage, s3_root)
    snapshot = s3_storage.open_snapshot(directory, ["state.pt"])
    first = snapshot.files["state.pt"].read(1000)
    s3_storage.write_atomic(s3_storage.join(directory, "state.pt"), os.urandom(300_000))  # replaced in place
    with pytest.raises(PreconditionFailedError):
        snapshot.files["state.pt"].read(1000)
    assert first == files["state.pt"][:1000]
    snapshot.close()
