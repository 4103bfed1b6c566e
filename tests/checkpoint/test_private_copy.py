"""Verified loads read ``state.pt`` once into a private copy (`supervisor.checkpoint.load.private_copy`):
the CRC-32 computed on the way is zlib's whatever the split into threads, a file shorter than it
was when opened (truncated meanwhile) is damage, the copy cannot be truncated by anyone, and a
restore's tensors survive the checkpoint file being truncated after the verified read (they map
the private copy, never the file: no SIGBUS, issue 21 item 11).
"""
from __future__ import annotations

import os
import random
import signal
import textwrap
import zlib

import pytest
import torch

from supervisor.checkpoint.load import private_copy
from supervisor.checkpoint.load.private_copy import read_private_copy
from supervisor.errors import CheckpointCorruptError
from tests import zygote
from tests.cli.helpers import ROOT

pytestmark = pytest.mark.timeout(120)

MEMFD = private_copy._MEMFD


@pytest.fixture(params=["memfd", "buffer"])
def form(request, monkeypatch):
    if request.param == "memfd" and not MEMFD:
        pytest.skip("no memfd_create or /proc/self/fd on this platform")
    monkeypatch.setattr(private_copy, "_MEMFD", request.param == "memfd")
    return request.param


def _read(path, size: int | None = None, **kwargs) -> private_copy.PrivateCopy:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_private_copy(fd, os.fstat(fd).st_size if size is None else size, f"{path}", **kwargs)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [1, (1 << 20) + 7, (5 << 20) + 12345])
def test_the_copy_holds_the_file_and_its_crc32_is_zlibs(tmp_path, monkeypatch, form, size):
    monkeypatch.setattr(private_copy, "_PARALLEL_MIN_BYTES", 1 << 20)  # several ranges, odd boundaries
    data = random.Random(size).randbytes(size)
    path = tmp_path / "state.pt"
    path.write_bytes(data)
    with _read(path) as copy:
        assert copy.size == size and copy.crc == zlib.crc32(data)
        if form == "memfd":
            with open(copy.path, "rb") as f:
                assert f.read() == data
        else:
            assert bytes(copy.data) == data
    with _read(path, checksum=False) as copy:
        assert copy.crc is None


def test_a_file_shorter_than_when_opened_is_damage(tmp_path, form):
    path = tmp_path / "state.pt"
    path.write_bytes(b"x" * (3 << 20))
    with pytest.raises(CheckpointCorruptError, match=r"ended after \d+ of 4194304 bytes \(truncated"):
        _read(path, size=4 << 20)  # what fstat said before another process truncated it


def test_a_size_beyond_the_available_memory_is_refused_before_anything_is_allocated(tmp_path, form):
    path = tmp_path / "state.pt"
    path.write_bytes(b"x")
    with pytest.raises(CheckpointCorruptError, match="more than the .* memory"):
        _read(path, size=1 << 50)


@pytest.mark.skipif(not MEMFD, reason="no memfd_create or /proc/self/fd on this platform")
def test_nobody_can_truncate_or_change_the_private_copy(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(os.urandom(1 << 16))
    with _read(path) as copy:
        with pytest.raises(PermissionError):  # another opener, by /proc/<pid>/fd: sealed
            os.truncate(copy.path, 10)
        fd = os.open(copy.path, os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                os.ftruncate(fd, 10)
        finally:
            os.close(fd)
        with pytest.raises(PermissionError):
            with open(copy.path, "r+b", buffering=0) as other:
                other.write(b"changed")
        assert os.stat(copy.path).st_size == 1 << 16


@pytest.mark.skipif(not MEMFD, reason="the in-memory fallback reads into tensors of their own")
def test_a_restore_survives_the_checkpoint_file_being_truncated_after_the_verified_read(tmp_path):
    import supervisor

    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 4096)
    manager = supervisor.CheckpointManager(str(tmp_path), save_mode="sync")
    manager.open()
    manager.save(1, supervisor.TrainingState.from_arguments(model=model))
    manager.close()
    torch.save(model.state_dict(), tmp_path / "expected.pt")
    state = str(tmp_path / "model.ckpt-1" / "state.pt")
    done = zygote.python(["-c", textwrap.dedent(f"""
        import os
        import torch
        import supervisor
        from supervisor.checkpoint.formats.safe_globals import Unpickling

        real = Unpickling.load

        def truncating_load(*args, **kwargs):  # verified and loaded: now another process truncates it
            payload = real(*args, **kwargs)
            os.truncate({state!r}, 0)
            return payload

        Unpickling.load = truncating_load
        model = torch.nn.Linear(1024, 4096)
        manager = supervisor.CheckpointManager({str(tmp_path)!r}, save_mode="sync")
        manager.open()
        print("restored:", manager.restore(supervisor.TrainingState.from_arguments(model=model)))
        expected = torch.load({str(tmp_path / "expected.pt")!r})
        print("equal:", all(torch.equal(model.state_dict()[k], v) for k, v in expected.items()))
    """)], timeout=100, env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert done.returncode != -signal.SIGBUS, "the restore was killed by SIGBUS"
    assert done.returncode == 0, done.stderr
    assert "restored:" in done.stdout and "equal: True" in done.stdout, done.stdout


def test_restore_and_the_evaluators_read_load_the_same_through_either_form(tmp_path, form):
    import supervisor
    from supervisor.checkpoint.load.loader import read_checkpoint
    from supervisor.checkpoint.load.loader import load_verified

    model = torch.nn.Linear(64, 32)
    with supervisor.CheckpointManager(str(tmp_path), save_mode="sync") as manager:
        manager.save(3, supervisor.TrainingState.from_arguments(model=model))
    path = str(tmp_path / "model.ckpt-3")
    for loaded, mapped in ((load_verified(path, mmap=True), form == "memfd"), (load_verified(path), False),
                           (read_checkpoint(path), form == "memfd")):
        assert loaded.step == 3 and loaded.mapped == mapped
        assert torch.equal(loaded.payload["model"]["weight"], model.weight.detach())
