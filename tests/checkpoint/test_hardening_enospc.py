"""Issue 9 findings 9 and 10 with real filesystems: a tmpfs starved of inodes makes the index
update fail with a real ENOSPC after the checkpoint committed; a read-only tmpfs logdir is
refused at construction, before any thread starts. Skipped only where mounting is not allowed."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from supervisor import MonitoredTrainingSession, Supervisor
from supervisor.checkpoint import CheckpointManager, verify_checkpoint
from supervisor.errors import CheckpointError

from .conftest import small_state, train_step


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, options)`` mounts a fresh tmpfs under ``tmp_path``; all are unmounted after."""
    mounted = []

    def mount(name: str, options: str):
        path = tmp_path / name
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def _fill_inodes(directory) -> list[str]:
    """Creates empty files until the filesystem has no inode left; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    made = []
    while True:
        path = os.path.join(directory, f"f{len(made)}")
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            return made
        made.append(path)


def test_enospc_writing_the_index_leaves_a_complete_checkpoint_that_is_named(tmpfs, clock, caplog):
    mnt = tmpfs("small", "size=8m,nr_inodes=64")
    logdir = mnt / "logdir"
    state = small_state()
    with CheckpointManager(logdir, clock=clock) as manager:
        manager.save(1, state, wait=True)
        weights_1 = {k: v.clone() for k, v in state["model"].state_dict().items()}
        fillers = _fill_inodes(mnt / "fill")
        for path in fillers[-3:]:  # room for the checkpoint (dir, state.pt, manifest), none for the index
            os.remove(path)
        train_step(state, 2)
        with pytest.raises(CheckpointError, match="committed to .*model.ckpt-2 but the index .* could not be "
                                                   "updated.*No space left on device"):
            manager.save(2, state, wait=True)
    assert verify_checkpoint(str(logdir / "model.ckpt-2")).step == 2  # complete and verified
    for path in fillers[:-3]:
        os.remove(path)
    fresh = small_state(seed=9)
    with caplog.at_level(logging.WARNING), CheckpointManager(logdir, clock=clock) as manager:
        restored = manager.restore(fresh)
    assert restored.global_step == 1  # the index stays the authority...
    for key, value in fresh["model"].state_dict().items():
        assert torch.equal(value, weights_1[key])
    assert ("complete checkpoint(s) model.ckpt-2 are newer than model.ckpt-1 but not in the index"
            in caplog.text)  # ...and the start says what it ignores and how to use it
    assert "set model_checkpoint_path" in caplog.text


@pytest.fixture
def read_only_logdir(tmpfs):
    mnt = tmpfs("ro", "size=1m")
    (mnt / "logdir").mkdir()
    result = subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"cannot remount read-only: {result.stderr.strip()}")
    return mnt / "logdir"


@pytest.mark.parametrize("front_door", ["MonitoredTrainingSession", "Supervisor", "CheckpointManager"])
def test_read_only_logdir_is_refused_before_any_thread_starts(read_only_logdir, capfd, front_door):
    threads_before = set(threading.enumerate())
    model = torch.nn.Linear(2, 2)
    # The front doors refuse it at construction (ValueError, SPEC §11); the manager when opened.
    with pytest.raises((CheckpointError, ValueError)) as info:
        if front_door == "MonitoredTrainingSession":
            MonitoredTrainingSession(read_only_logdir, model=model, save_summaries_steps=1)
        elif front_door == "Supervisor":
            with Supervisor(read_only_logdir, model=model).managed_session():
                pass
        else:
            CheckpointManager(read_only_logdir).open()
    message = str(info.value)
    assert str(read_only_logdir) in message
    assert "EROFS" in message and ("writable" in message)
    assert isinstance(info.value, CheckpointError if front_door == "CheckpointManager" else ValueError)
    assert set(threading.enumerate()) <= threads_before
    assert "Traceback" not in capfd.readouterr().err  # no TensorBoard thread died on the way


def test_output_dir_that_is_a_file_is_refused_at_construction(tmp_path):
    from hooks import ProfilerHook

    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="output_dir .*notes.txt' exists and is not a directory"):
        ProfilerHook(save_steps=1, output_dir=a_file)


SETPRIV = shutil.which("setpriv")


@pytest.mark.skipif(SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv to drop CAP_DAC_*")
def test_logdir_without_write_permission_is_refused_naming_the_path(tmp_path):
    """A real EACCES: the process runs without CAP_DAC_OVERRIDE (as an unprivileged user would)
    and the logdir is not writable: a clear error at construction, not filelock's PermissionError,
    and no TensorBoard thread traceback."""
    logdir = tmp_path / "logdir"
    logdir.mkdir()
    os.chmod(logdir, 0o555)
    script = textwrap.dedent(f"""
        import threading, torch
        from supervisor import MonitoredTrainingSession
        from supervisor.errors import CheckpointError
        try:
            MonitoredTrainingSession({str(logdir)!r}, model=torch.nn.Linear(2, 2))
        except (CheckpointError, ValueError) as e:
            print("REFUSED", e)
        print("THREADS", threading.active_count())
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    try:  # a fresh interpreter under setpriv (no fork of the zygote can drop its capabilities so)
        out = subprocess.run([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", script],
                             capture_output=True, text=True, timeout=120, env=env)
    finally:
        os.chmod(logdir, 0o755)
    # refused at construction (SPEC §11: a ValueError naming the argument, the path and the fix)
    assert f"REFUSED checkpoint_dir {str(logdir)!r} cannot be written: no write permission" in out.stdout, \
        out.stdout + out.stderr
    assert "THREADS 1" in out.stdout and "Traceback" not in out.stderr, out.stderr
