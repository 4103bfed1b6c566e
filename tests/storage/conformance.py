"""The storage conformance suite: what every `Storage` backend guarantees (SPEC §16), run on a
fixture ``backend`` that yields ``(storage, root)``: the backend and a fresh, empty directory of
it in its spelling.

A backend runs it from a test module of its own (tests/storage/test_conformance.py runs it on
the local, s3 (moto) and memory backends)::

    from tests.storage.conformance import *  # noqa: F401,F403 - the suite's tests

    @pytest.fixture
    def backend():
        storage = MyStorage(...)
        root = storage.join("my://bucket", uuid.uuid4().hex)
        yield storage, root
        storage.remove_tree(root)

Where the two kinds differ (``storage.kind``: POSIX renames vs an object store's manifest-last
commit) a test asks ``storage.is_object_store``. What only one backend has (the object store's
request timeouts and multipart uploads, a local FIFO) is tested beside it
(test_object_store*.py, test_storage_protocol.py).
"""
from __future__ import annotations

import errno
import os
import threading
import zlib

import pytest

from supervisor.checkpoint.storage import (STORAGE_KINDS, ObjectExistsError, PreconditionFailedError,
                                           SnapshotVanishedError, Storage, check_declared)

__all__ = [name for name in dir() if name.startswith("test_")]  # filled at the end

_TIMEOUT = 60


def test_declares_the_contract(backend):
    storage, root = backend
    assert isinstance(storage, Storage)
    check_declared(storage)
    assert storage.kind in STORAGE_KINDS and storage.is_object_store == (storage.kind == "object")
    assert isinstance(storage.part_size, int) and storage.part_size > 0
    assert isinstance(storage.max_concurrency, int) and storage.max_concurrency > 0
    assert storage.abort_uploads(root, lambda name: True) == []  # nothing unfinished in a fresh root


def test_write_atomic_replaces_whole_and_every_write_is_a_new_version(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "checkpoint")
    first = storage.write_atomic(path, b"index v1")
    second = storage.write_atomic(path, b"index v2, longer")
    assert first.version != second.version and second.size == len(b"index v2, longer")
    data, info = storage.read_versioned(path)
    assert data == b"index v2, longer" and info.version == second.version == storage.stat(path).version


def test_create_exclusive_is_refused_on_an_existing_object(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "lease.json")
    storage.create_exclusive(path, b"first")
    with pytest.raises(ObjectExistsError, match="already exists"):
        storage.create_exclusive(path, b"second")
    assert storage.read_bytes(path) == b"first"


def test_create_exclusive_has_one_winner_among_racing_threads(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "lease.json")
    start, won, lost = threading.Barrier(6), [], []

    def race(i: int) -> None:
        start.wait(_TIMEOUT)
        try:
            storage.create_exclusive(path, f"writer {i}".encode())
            won.append(i)
        except ObjectExistsError:
            lost.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT)
    assert len(won) == 1 and len(lost) == 5
    assert storage.read_bytes(path) == f"writer {won[0]}".encode()


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
    with pytest.raises(OSError, match="more than") as raised:
        storage.read_bytes(path, max_bytes=100)
    assert raised.value.errno == errno.EFBIG
    with storage.open_read(path) as f:
        f.seek(1000)
        assert f.read(10) == payload[1000:1010]


def test_missing_paths(backend):
    storage, root = backend
    storage.makedirs(root)
    missing = storage.join(root, "missing")
    for read in (storage.read_bytes, storage.read_versioned, storage.stat, storage.open_read,
                 lambda p: storage.read_range(p, 0, 10)):
        with pytest.raises(FileNotFoundError):
            read(missing)
    assert not storage.exists(missing) and not storage.isdir(missing)
    assert storage.entry_kind(missing) is None
    assert storage.remove(missing) is False
    storage.remove_tree(missing)  # nothing to remove: no error
    assert storage.uncommit(missing) is None
    assert storage.list_files(root) == []


def test_listing_and_removing_a_prefix(backend):
    storage, root = backend
    for rel in ("ckpt-1/a", "ckpt-1/sub/b", "ckpt-2/a", "checkpoint"):
        path = storage.join(root, *rel.split("/"))
        storage.makedirs(storage.dirname(path))
        storage.write_atomic(path, rel.encode())
    assert storage.listdir(root) == ["checkpoint", "ckpt-1", "ckpt-2"]
    assert storage.list_files(storage.join(root, "ckpt-1")) == ["a", "sub/b"]
    assert storage.isdir(storage.join(root, "ckpt-1")) and not storage.isdir(storage.join(root, "checkpoint"))
    assert storage.entry_kind(storage.join(root, "ckpt-1")) == "dir"
    assert storage.entry_kind(storage.join(root, "checkpoint")) == "file"
    assert storage.basename(storage.join(root, "ckpt-1")) == "ckpt-1"
    assert storage.dirname(storage.join(root, "ckpt-1")) == root
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
        assert not storage.exists(path) or not storage.is_object_store  # an upload shows nothing yet
        writer.sync()
    assert writer.nbytes == len(data)
    assert writer.checksum == f"crc32:{zlib.crc32(data):08x}"
    assert storage.read_bytes(path) == data
    assert storage.checksum(path) == (len(data), f"crc32:{zlib.crc32(data):08x}")

    abandoned = storage.join(root, "abandoned")
    w = storage.open_write(abandoned)
    w.write(b"partial")
    w.close()
    assert not storage.exists(abandoned)


def test_open_write_never_overwrites_an_existing_file(backend):
    storage, root = backend
    storage.makedirs(root)
    path = storage.join(root, "state.pt")
    storage.write_atomic(path, b"committed bytes")
    with pytest.raises(FileExistsError):
        with storage.open_write(path) as writer:  # local: refused here; an object store: when completed
            writer.write(b"x" * 10)
            writer.sync()
    assert storage.read_bytes(path) == b"committed bytes"


def _write(storage, path: str, data: bytes) -> None:
    with storage.open_write(path) as w:
        w.write(data)
        w.sync()


def test_stage_commit_discard_uncommit(backend):
    storage, root = backend
    storage.makedirs(root)
    final = storage.join(root, "model.ckpt-5")
    staged = storage.stage(root, "model.ckpt-5")
    assert (staged == final) == storage.is_object_store  # written in place only on an object store
    _write(storage, storage.join(staged, "state.pt"), b"tensor bytes")
    storage.commit(staged, final, manifest_name="MANIFEST.json", manifest=b"{}")
    assert storage.list_files(final) == ["MANIFEST.json", "state.pt"]
    assert [n for n in storage.listdir(root) if "tmp" in n] == []

    other = storage.stage(root, "model.ckpt-6")
    _write(storage, storage.join(other, "state.pt"), b"x")
    storage.discard(other)
    assert storage.listdir(root) == ["model.ckpt-5"]

    remains = storage.uncommit(final)
    assert remains is not None and not storage.exists(storage.join(final, "MANIFEST.json"))
    storage.remove_tree(remains)
    assert not storage.isdir(final) and storage.uncommit(final) is None


def test_rename_locally_none_on_an_object_store(backend):
    storage, root = backend
    storage.makedirs(root)
    src, dst = storage.join(root, "a"), storage.join(root, "b")
    storage.write_atomic(src, b"x")
    if storage.is_object_store:
        with pytest.raises(OSError) as raised:
            storage.rename(src, dst)
        assert raised.value.errno == errno.ENOTSUP
    else:
        storage.rename(src, dst)
        storage.sync_dir(root)
        assert storage.read_bytes(dst) == b"x" and not storage.exists(src)


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


def _read_or_refused(snapshot, name: str) -> bytes | None:
    """The whole file as the snapshot reads it, or None where the backend refuses a file that
    changed since the snapshot was taken (an object store's ``If-Match``)."""
    try:
        return snapshot.files[name].read()
    except (FileNotFoundError, PreconditionFailedError):
        return None


def test_a_snapshot_notices_the_checkpoint_deleted_underneath_it(backend):
    """Retention deletes a checkpoint an evaluator is reading: the snapshot reads it whole (local
    descriptors; bytes taken when it was opened) or fails cleanly (an object store's deleted
    object: FileNotFoundError), and ``vanished()`` says why either way."""
    storage, root = backend
    directory, files = _checkpoint(storage, root)
    snapshot = storage.open_snapshot(directory, ["state.pt"])
    try:
        storage.remove_tree(directory)
        assert snapshot.vanished()
        assert _read_or_refused(snapshot, "state.pt") in (files["state.pt"], None)
    finally:
        snapshot.close()


def test_a_snapshot_never_mixes_two_versions_of_a_file(backend):
    storage, root = backend
    directory, files = _checkpoint(storage, root)
    snapshot = storage.open_snapshot(directory, ["state.pt"])
    try:
        first = snapshot.files["state.pt"].read(1000)
        storage.write_atomic(storage.join(directory, "state.pt"), os.urandom(300_000))  # replaced in place
        rest = _read_or_refused(snapshot, "state.pt")
        assert first == files["state.pt"][:1000]
        assert rest is None or first + rest == files["state.pt"]
    finally:
        snapshot.close()


__all__ = [name for name in dir() if name.startswith("test_")]
