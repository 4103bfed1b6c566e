"""The storage seam beyond the conformance suite (tests/storage/conformance.py, run on every
backend by test_conformance.py): the declared contract refusing a backend that omits a member,
scheme discovery by entry points in another process, and what only one backend has (an S3
multipart upload, a local FIFO, S3's ``If-Match`` reads)."""
from __future__ import annotations

import os
import textwrap
import threading

import pytest

from supervisor.checkpoint import storage as storage_module
from supervisor.checkpoint.storage.local import LocalStorage
from supervisor.checkpoint.storage import PreconditionFailedError, Storage, register_scheme, storage_for

from tests import zygote

pytestmark = pytest.mark.timeout(60)


def test_an_s3_multipart_upload_never_overwrites_an_existing_object(s3_storage, s3_root):
    path = s3_storage.join(s3_root, "state.pt")
    s3_storage.write_atomic(path, b"committed bytes")
    storage = type(s3_storage)(s3_storage.fs, part_size=5 << 20)  # 6 MiB: a multipart upload
    with pytest.raises(FileExistsError):
        with storage.open_write(path) as writer:  # refused when completed
            writer.write(b"x" * (6 << 20))
            writer.sync()
    assert storage.read_bytes(path) == b"committed bytes"


class _NoScheme:  # duck-typed: every method of LocalStorage, no contract
    def __getattr__(self, name):
        return getattr(LocalStorage(), name)


def test_a_backend_that_omits_a_member_is_refused_naming_it(monkeypatch):
    """Before the contract, a backend without ``scheme`` saved fine and every restore then said
    "does not exist"; now it fails where it is defined, registered or made."""
    with pytest.raises(TypeError, match="declares no 'scheme'"):
        class Schemeless(LocalStorage):
            scheme = None
    with pytest.raises(TypeError, match="declares no 'kind'"):
        type("Kindless", (Storage,), {"scheme": "kl", **{m: lambda *a: None for m in storage_module.REQUIRED_METHODS}})
    with pytest.raises(TypeError, match="only 'file' is local"):
        class LocalLookingUrl(LocalStorage):
            scheme = "nfs"
    monkeypatch.setattr(storage_module, "_FACTORIES", dict(storage_module._FACTORIES))

    class Unfinished(Storage):  # abstract: read_range and the rest missing
        scheme, kind = "unfinished", "object"

        @classmethod
        def from_url(cls, url, options):
            return cls()

    register_scheme("unfinished", Unfinished)
    with pytest.raises(TypeError, match="abstract method.*read_range"):
        storage_for("unfinished://bucket/run")
    register_scheme("duck", lambda url, options: _NoScheme())
    with pytest.raises(TypeError, match="does not subclass supervisor.checkpoint.storage.Storage"):
        storage_for("duck://bucket/run")
    register_scheme("other", lambda url, options: LocalStorage())
    with pytest.raises(TypeError, match="serves scheme='file', but it was registered for other://"):
        storage_for("other://bucket/run")


_PLUGIN = """
    from supervisor.checkpoint.storage.memory import MemoryStorage

    class PluginStorage(MemoryStorage):
        scheme = "memory-like"

        def join(self, base, *parts):  # its URLs are memory-like://, its objects the memory ones
            return super().join(base, *parts)

    def factory(url, options):
        print("plugin factory called for", url)
        return PluginStorage()
"""


@pytest.mark.slow
@pytest.mark.timeout(300)  # two CLI processes, each importing torch
def test_a_scheme_declared_by_an_entry_point_is_found_by_another_process(tmp_path):
    """A scheme registered in-process is unknown to the CLI; one declared in the entry-point group
    ``torch_supervisor.storage`` of an installed distribution is found by any process."""
    site = tmp_path / "site"
    (site / "memory_like_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "memory_like_plugin.py").write_text(textwrap.dedent(_PLUGIN))
    (site / "memory_like_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: memory-like-plugin\nVersion: 1.0\n")
    (site / "memory_like_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[torch_supervisor.storage]\nmemory-like = memory_like_plugin:factory\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    done = zygote.run(["ls", "memory-like://bucket/run"], env=env, timeout=120)  # forked: tests/zygote.py
    assert "plugin factory called for memory-like://bucket/run" in done.stdout, done.stdout + done.stderr
    assert "no storage for the URL scheme" not in done.stdout + done.stderr
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")  # without the plugin: refused, naming the scheme
    done = zygote.run(["ls", "memory-like://bucket/run"], env=env, timeout=120)
    assert done.returncode != 0 and "no storage for the URL scheme 'memory-like'" in done.stderr, done.stderr


def test_storage_for_picks_by_scheme_and_names_what_is_missing(tmp_path, monkeypatch):
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    with pytest.raises(ValueError, match=r"'gs://bucket/x'.*scheme 'gs'"):
        storage_for("gs://bucket/x")
    with pytest.raises(ValueError, match="object-store URLs only"):
        storage_for(str(tmp_path), {"anon": True})

    # s3fs missing, as Python marks a module that cannot be imported: the storage module finds the
    # extra without importing it (the client is imported on first use), `import s3fs` fails alike
    monkeypatch.delitem(__import__("sys").modules, "supervisor.checkpoint.storage.s3.store", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "s3fs", None)
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


def test_a_snapshot_never_mixes_two_versions_of_a_file(s3_storage, s3_root):
    directory, files = _checkpoint(s3_storage, s3_root)
    snapshot = s3_storage.open_snapshot(directory, ["state.pt"])
    first = snapshot.files["state.pt"].read(1000)
    s3_storage.write_atomic(s3_storage.join(directory, "state.pt"), os.urandom(300_000))  # replaced in place
    with pytest.raises(PreconditionFailedError):
        snapshot.files["state.pt"].read(1000)
    assert first == files["state.pt"][:1000]
    snapshot.close()
