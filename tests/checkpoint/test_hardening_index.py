"""Issue 9 (findings 1, 4, 6, 8, 9) and issue 8 item 6: the index and the files of a checkpoint
are untrusted input. Hand-edited indexes, planted symlinks/FIFOs, malicious pickles: nothing
outside the checkpoint form is ever deleted or loaded, and every message says what happened."""
from __future__ import annotations

import errno
import logging
import os
import random
import pickle
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from supervisor.checkpoint import (
    CheckpointManager,
    checkpoints_iterator,
    get_checkpoint_state,
    latest_checkpoint,
    load_checkpoint,
    verify_checkpoint,
)
from supervisor.checkpoint.storage.fileio import checksum_file
from supervisor.checkpoint.layout.format import FileRecord, Manifest
from supervisor.errors import CheckpointCorruptError, CheckpointError

from .conftest import restore_into, small_state, train_step


@pytest.fixture
def logdir(tmp_path, clock):
    """Committed checkpoints of steps 1, 2, 3 (the index names step 3)."""
    state = small_state()
    with CheckpointManager(tmp_path / "logdir", clock=clock) as manager:
        for step in (1, 2, 3):
            train_step(state, step)
            manager.save(step, state, wait=True)
    return tmp_path / "logdir"


def _index(logdir, latest, *listed):
    """Writes the index by hand, as a person (or an attacker) would, with save times."""
    lines = [f'model_checkpoint_path: "{latest}"'] + [f'all_model_checkpoint_paths: "{p}"' for p in listed]
    lines += [f"all_model_checkpoint_timestamps: {1_699_999_000.0 + i}" for i, _ in enumerate(listed)]
    lines += ["last_preserved_timestamp: 1699990000.0"] if listed else []
    (logdir / "checkpoint").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- finding 1
def test_retention_never_deletes_what_a_hand_edited_index_lists(logdir, tmp_path, clock, caplog):
    userdata = logdir / "userdata"
    userdata.mkdir()
    (userdata / "precious.txt").write_text("keep me")
    outside = tmp_path / "elsewhere-7"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me too")
    (logdir / "model.ckpt-9").symlink_to(outside, target_is_directory=True)  # a symlink out
    listed = ["userdata", ".supervisor.lock", "../elsewhere-7", str(outside), "model.ckpt-9",
              "sub/model.ckpt-1", "model.ckpt-1", "model.ckpt-2", "model.ckpt-3"]
    _index(logdir, "model.ckpt-3", *listed)
    state = small_state()
    with caplog.at_level(logging.WARNING), CheckpointManager(logdir, clock=clock, max_to_keep=1) as manager:
        lock_file = logdir / ".supervisor.lock"
        for step in (4, 5, 6):
            manager.save(step, state, wait=True)
            assert lock_file.exists()  # the running writer's lock was never renamed away
            with pytest.raises(Exception, match="in use by another writer"):
                CheckpointManager(logdir, clock=clock).open()  # so a second writer is still refused
    assert (userdata / "precious.txt").read_text() == "keep me"
    assert (outside / "precious.txt").read_text() == "keep me too"
    assert (logdir / "model.ckpt-9").is_symlink()
    assert sorted(p.name for p in logdir.glob("model.ckpt-*")) == ["model.ckpt-6", "model.ckpt-9"]
    for entry in ("userdata", ".supervisor.lock", "../elsewhere-7", str(outside), "model.ckpt-9",
                  "sub/model.ckpt-1"):
        assert f"ignoring the checkpoint index entry all_model_checkpoint_paths {entry!r}" in caplog.text


@pytest.mark.parametrize("entry, why", [
    ("userdata", "not a checkpoint name"),
    ("../other/model.ckpt-3", "not directly inside the logdir"),
    ("/tmp/model.ckpt-3", "outside the logdir"),
    ("model.ckpt-8", "symbolic link out of the logdir"),
])
def test_restore_never_loads_what_the_index_names_outside_the_checkpoint_form(logdir, tmp_path, clock, caplog,
                                                                              entry, why):
    evil = tmp_path / "evil"
    evil.mkdir()
    (logdir / "model.ckpt-8").symlink_to(evil, target_is_directory=True)
    _index(logdir, entry)
    with caplog.at_level(logging.WARNING):
        restored = restore_into(logdir, small_state(seed=5), clock=clock)
        assert latest_checkpoint(logdir) is None
    assert restored.global_step == 3  # the highest committed checkpoint of this logdir
    assert why in caplog.text
    assert "skipping checkpoint" not in caplog.text  # nothing outside was even tried


# ---------------------------------------------------------------- finding 4
@pytest.mark.parametrize("call", [
    lambda p, d: verify_checkpoint(p, verify="Full"),
    lambda p, d: load_checkpoint(p, verify="Full"),
    lambda p, d: checkpoints_iterator(d, verify="Full", timeout=0),
    lambda p, d: CheckpointManager(d, verify="Full"),
], ids=["verify_checkpoint", "load_checkpoint", "checkpoints_iterator", "CheckpointManager"])
def test_verify_typo_is_refused_naming_the_choices(logdir, call):
    path = str(logdir / "model.ckpt-3")
    data = bytearray((logdir / "model.ckpt-3" / "state.pt").read_bytes())
    data[len(data) // 2] ^= 1  # a bit flip that only verify="full" catches
    (logdir / "model.ckpt-3" / "state.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="verify must be one of 'full', 'size'.*got 'Full'"):
        call(path, str(logdir))  # at the call: the iterator is not even started


# ---------------------------------------------------------------- finding 6
def _corrupt_state_file(checkpoint, how):
    state = checkpoint / "state.pt"
    state.unlink()
    if how == "symlink loop":
        os.symlink("state.pt", state)
    elif how == "fifo":
        os.mkfifo(state)


@pytest.mark.parametrize("how, reason", [("symlink loop", "ELOOP"), ("fifo", "not a regular file (a FIFO)")])
def test_unreadable_state_file_falls_back_with_a_warning(logdir, clock, caplog, how, reason):
    _corrupt_state_file(logdir / "model.ckpt-3", how)
    with caplog.at_level(logging.WARNING):
        restored = restore_into(logdir, small_state(seed=5), clock=clock)  # a FIFO is never opened
    assert restored.global_step == 2
    assert "skipping checkpoint" in caplog.text and reason in caplog.text


def test_eio_on_stat_falls_back_with_a_warning(logdir, clock, caplog, monkeypatch):
    real_stat = os.stat
    target = str(logdir / "model.ckpt-3" / "state.pt")

    def failing_stat(path, *args, **kwargs):
        if os.fspath(path) == target:
            raise OSError(errno.EIO, os.strerror(errno.EIO), target)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", failing_stat)
    with caplog.at_level(logging.WARNING):
        restored = restore_into(logdir, small_state(seed=5), clock=clock)
    assert restored.global_step == 2 and "EIO" in caplog.text


SETPRIV = shutil.which("setpriv")


@pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv to drop CAP_DAC_*")
def test_eacces_falls_back_with_a_warning(logdir):
    """A real EACCES: the reader runs without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (as an
    unprivileged user would) and the newest checkpoint's directory is not searchable."""
    os.chmod(logdir / "model.ckpt-3", 0o000)
    script = textwrap.dedent(f"""
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        from supervisor.checkpoint.load.choose import find_and_load
        print("RESTORED", find_and_load({str(logdir)!r}, "model.ckpt").step)
    """)
    try:  # a fresh interpreter under setpriv (no fork of the zygote can drop its capabilities so)
        out = subprocess.run([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
                              script], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.chmod(logdir / "model.ckpt-3", 0o755)
    if "Operation not permitted" in out.stderr and "setpriv" in out.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {out.stderr}")
    assert "RESTORED 2" in out.stdout, out.stdout + out.stderr
    assert "EACCES" in out.stdout


# ---------------------------------------------------------------- finding 8
def test_index_naming_a_missing_older_step_says_newer_ones_exist(logdir, clock):
    _index(logdir, "model.ckpt-0")
    with pytest.raises(CheckpointCorruptError) as info:
        restore_into(logdir, small_state(seed=5), clock=clock)
    message = str(info.value)
    assert "model.ckpt-0: does not exist" in message
    assert "Newer checkpoint(s) exist (model.ckpt-1, model.ckpt-2, model.ckpt-3)" in message
    assert "set model_checkpoint_path" in message


def _plant(checkpoint, raw: bytes):
    (checkpoint / "state.pt").write_bytes(raw)
    size, checksum = checksum_file(str(checkpoint / "state.pt"))
    manifest = Manifest(step=3, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                        files={"state.pt": FileRecord(size, checksum)})
    (checkpoint / "MANIFEST.json").write_text(manifest.to_json())


class _Exec:
    def __reduce__(self):
        return (exec, ("open('/tmp/never-created-by-supervisor', 'w').close()",))


@pytest.mark.parametrize("kind", ["garbage", "protocol-4 pickle"])
def test_unloadable_state_file_is_described_without_unsafe_advice(logdir, clock, caplog, kind):
    raw = random.Random(0).randbytes(4096) if kind == "garbage" else pickle.dumps({"model": _Exec()}, protocol=4)
    _plant(logdir / "model.ckpt-3", raw)
    with caplog.at_level(logging.WARNING):
        restored = restore_into(logdir, small_state(seed=5), clock=clock)
    assert restored.global_step == 2
    text = caplog.text
    assert "weights_only` set to `False" not in text and "weights_only=False" not in text
    assert "mmap" not in text  # the mapping attempt is not blamed
    assert "needs globals or pickle operations that are not allowed" in text
    assert "not a zip archive" in text
    assert not os.path.exists("/tmp/never-created-by-supervisor")


# ---------------------------------------------------------------- finding 9 (the message; ENOSPC itself: test_hardening_enospc)
def test_complete_checkpoint_missing_from_the_index_is_named(logdir, clock, caplog):
    _index(logdir, "model.ckpt-2", "model.ckpt-1", "model.ckpt-2")  # the update for step 3 never landed
    with caplog.at_level(logging.WARNING):
        restored = restore_into(logdir, small_state(seed=5), clock=clock)
    assert restored.global_step == 2  # the index stays the authority
    assert "model.ckpt-3 are newer than model.ckpt-2 but not in the index" in caplog.text


# ---------------------------------------------------------------- issue 8 item 6
def test_leftover_temp_with_any_suffix_is_removed_at_open(logdir, clock, caplog):
    leftover = logdir / "model.ckpt-7.tmp-xyz"
    leftover.mkdir()
    (leftover / "state.pt").write_bytes(b"half")
    deleting = logdir / "model.ckpt-1.deleting-old"
    deleting.mkdir()
    unrelated = logdir / "notes.tmp-keep"
    unrelated.write_text("not a checkpoint's")
    with caplog.at_level(logging.WARNING), CheckpointManager(logdir, clock=clock):
        pass
    assert not leftover.exists() and not deleting.exists()
    assert unrelated.exists()
    assert "model.ckpt-7.tmp-xyz left behind" in caplog.text


@pytest.mark.parametrize("content", ["", "# only a comment\n", 'model_checkpoint_path: ""\n'])
def test_get_checkpoint_state_on_an_empty_index_raises_value_error(tmp_path, content):
    (tmp_path / "checkpoint").write_text(content)
    with pytest.raises(ValueError, match="names no model_checkpoint_path"):
        get_checkpoint_state(tmp_path)
    assert get_checkpoint_state(tmp_path / "missing") is None  # no index at all: None, as TF


def test_index_that_is_a_fifo_is_not_opened(logdir, clock, caplog):
    os.remove(logdir / "checkpoint")
    os.mkfifo(logdir / "checkpoint")
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(logdir) is None
        restored = restore_into(logdir, small_state(seed=5), clock=clock)
    assert restored.global_step == 3 and "is not a regular file" in caplog.text


def test_manifest_listing_a_path_outside_the_checkpoint_is_corrupt(logdir):
    checkpoint = logdir / "model.ckpt-3"
    manifest = Manifest(step=3, wall_time=0.0, torch_version=torch.__version__, world_size=1,
                        files={"state.pt": FileRecord(1, "crc32:0"), "../../etc/passwd": FileRecord(1, "crc32:0")})
    (checkpoint / "MANIFEST.json").write_text(manifest.to_json())
    with pytest.raises(CheckpointCorruptError, match="not a file name inside the checkpoint"):
        verify_checkpoint(str(checkpoint))


def test_a_checkpoint_error_is_not_raised_for_a_healthy_logdir(logdir):
    assert verify_checkpoint(str(logdir / "model.ckpt-3")).step == 3
    assert isinstance(load_checkpoint(logdir / "model.ckpt-3")["global_step"], int)
    with pytest.raises(CheckpointError):
        load_checkpoint(logdir / "model.ckpt-99")


def test_relative_index_leaves_out_what_is_not_a_checkpoint_of_the_logdir(logdir, caplog):
    """What tools that prune or roll back by the index build on (e.g. the CLI)."""
    from supervisor.checkpoint.layout.index import read_index, relative_index

    _index(logdir, "model.ckpt-3", "userdata", ".supervisor.lock", "../x-1", str(logdir / "model.ckpt-1"),
           "model.ckpt-2")
    with caplog.at_level(logging.WARNING):
        relative = relative_index(read_index(str(logdir)), str(logdir))
    assert relative.all_model_checkpoint_paths == ("model.ckpt-1", "model.ckpt-2")
    assert len(relative.all_model_checkpoint_timestamps) == 2
    assert caplog.text.count("ignoring the checkpoint index entry") == 3
