"""The ownership lock (SPEC §5.6): a second writer fails at once, naming the holder."""
from __future__ import annotations

import os
import socket
import textwrap
import time

import pytest

from supervisor.checkpoint import CheckpointManager
from supervisor.errors import LogdirInUseError

from tests import forked_io, zygote


def test_second_manager_in_the_same_process_fails_fast(tmp_path, clock):
    first = CheckpointManager(tmp_path, clock=clock)
    first.open()
    try:
        second = CheckpointManager(tmp_path, clock=clock)
        start = time.monotonic()
        with pytest.raises(LogdirInUseError) as info:
            second.open()
        assert time.monotonic() - start < 1.0
        message = str(info.value)
        assert f"pid {os.getpid()}" in message and socket.gethostname() in message
        assert str(tmp_path) in message
    finally:
        first.close()
    third = CheckpointManager(tmp_path, clock=clock)
    third.open()  # released by close
    third.close()


def test_a_writer_in_another_process_is_named(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from supervisor.checkpoint import CheckpointManager
        manager = CheckpointManager({str(tmp_path)!r})
        manager.open()
        print("ready", flush=True)
        sys.stdin.readline()
        manager.close()
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    child = forked_io.code(script, stdin_pipe=True, env=env)
    try:
        assert forked_io.lines(child, 1, timeout=120) == ["ready"]
        with pytest.raises(LogdirInUseError) as info:
            CheckpointManager(tmp_path).open()
        assert f"pid {child.pid}" in str(info.value)
        assert socket.gethostname() in str(info.value)
    finally:
        child.stdin.write(b"\n")
        child.stdin.flush()
        child.wait(timeout=30)
    assert child.returncode == 0
    manager = CheckpointManager(tmp_path)
    manager.open()
    manager.close()


def test_a_killed_holder_releases_the_lock(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from supervisor.checkpoint import CheckpointManager
        CheckpointManager({str(tmp_path)!r}).open()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    zygote.python(["-c", script], env=env, timeout=60)
    manager = CheckpointManager(tmp_path)
    manager.open()  # the kernel dropped the dead process's lock; the stale owner file is replaced
    manager.close()


def test_readers_need_no_lock(tmp_path, clock):
    from .conftest import small_state

    with CheckpointManager(tmp_path, clock=clock) as writer:
        writer.save(1, small_state(), wait=True)
        reader = CheckpointManager(tmp_path, clock=clock)  # never opened: read-only use
        assert reader.restore(small_state(seed=3)).global_step == 1
