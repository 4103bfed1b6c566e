"""Issue 9 finding 5: after a stale-lock takeover, `LogdirInUseError` names the live holder, never
the dead previous one (the owner record is written just after the lock is taken)."""
from __future__ import annotations

import json
import os
import signal
import textwrap

import pytest

from supervisor.checkpoint import CheckpointManager
from supervisor.checkpoint.ownership.lock import OWNER_FILE
from supervisor.errors import LogdirInUseError

from tests import forked_io, zygote

ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))


def _dead_holder(logdir) -> int:
    """A writer that takes the lock, records itself and is SIGKILLed: its record stays behind."""
    script = textwrap.dedent(f"""
        import os, signal
        from supervisor.checkpoint import CheckpointManager
        CheckpointManager({str(logdir)!r}).open()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    child = zygote.python(["-c", script], env=ENV, timeout=120)
    assert child.returncode == -signal.SIGKILL
    with open(logdir / OWNER_FILE, encoding="utf-8") as f:
        return json.load(f)["pid"]


def test_refused_writer_waits_for_the_new_holder_to_record_itself(tmp_path, monkeypatch):
    from supervisor.checkpoint.ownership import lock as lock_module

    dead_pid = _dead_holder(tmp_path)
    # The new holder takes the OS lock and records itself only once the refused writer has read the
    # dead holder's record: the window a loser used to fall into, entered every time (a handshake:
    # the loser's first read sends the holder the line it waits for).
    script = textwrap.dedent(f"""
        import json, os, socket, sys, time
        import filelock
        lock = filelock.FileLock({str(tmp_path / ".supervisor.lock")!r}, timeout=0)
        lock.acquire()
        print("locked", flush=True)
        sys.stdin.readline()
        with open({str(tmp_path / OWNER_FILE)!r}, "w") as f:
            json.dump({{"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}}, f)
        sys.stdin.readline()
    """)
    holder = forked_io.code(script, stdin_pipe=True, env=ENV)
    reads: list[dict] = []
    real_read = lock_module.read_owner_record

    def read_then_let_the_holder_record_itself(path: str) -> dict:
        reads.append(real_read(path))
        if len(reads) == 1:
            holder.stdin.write(b"\n")
            holder.stdin.flush()
        return reads[-1]

    monkeypatch.setattr(lock_module, "read_owner_record", read_then_let_the_holder_record_itself)
    monkeypatch.setattr(lock_module, "OWNER_RECORD_WAIT_SECS", 60.0)  # a bound for a loaded machine
    try:
        assert forked_io.lines(holder, 1, timeout=120) == ["locked"]
        with pytest.raises(LogdirInUseError) as info:
            CheckpointManager(tmp_path).open()
        assert reads[0]["pid"] == dead_pid  # the window was entered: the stale record was read first
        assert f"pid {holder.pid} " in str(info.value)
        assert f"pid {dead_pid} " not in str(info.value)
    finally:
        holder.stdin.write(b"\n\n")
        holder.stdin.flush()
        holder.wait(timeout=30)


def test_a_holder_that_never_records_itself_is_not_misnamed(tmp_path, monkeypatch):
    from supervisor.checkpoint.ownership import lock as lock_module

    monkeypatch.setattr(lock_module, "OWNER_RECORD_WAIT_SECS", 0.2)
    dead_pid = _dead_holder(tmp_path)
    script = textwrap.dedent(f"""
        import sys, filelock
        lock = filelock.FileLock({str(tmp_path / ".supervisor.lock")!r}, timeout=0)
        lock.acquire()
        print("locked", flush=True)
        sys.stdin.readline()
    """)
    holder = forked_io.code(script, stdin_pipe=True, env=ENV)
    try:
        assert forked_io.lines(holder, 1, timeout=120) == ["locked"]
        with pytest.raises(LogdirInUseError, match=f"pid and host unknown: the new holder has not recorded "
                                                   f"itself yet, .* still names pid {dead_pid} .* no longer running"):
            CheckpointManager(tmp_path).open()
    finally:
        holder.stdin.write(b"\n")
        holder.stdin.flush()
        holder.wait(timeout=30)


CONTENDERS = 6


@pytest.mark.slow
def test_takeover_race_every_loser_names_the_winner(tmp_path):
    """Real processes race to take over from a SIGKILLed holder; exactly one wins and every
    loser's error names the winner's pid."""
    dead_pid = _dead_holder(tmp_path)
    go = tmp_path / "go"
    script = textwrap.dedent(f"""
        import os, sys, time
        from supervisor.checkpoint import CheckpointManager
        from supervisor.errors import LogdirInUseError
        print("ready", flush=True)
        while not os.path.exists({str(go)!r}):
            time.sleep(0.001)
        manager = CheckpointManager({str(tmp_path)!r})
        try:
            manager.open()
        except LogdirInUseError as e:
            print("LOST", str(e).replace(chr(10), " "), flush=True)
            sys.exit(0)
        print("WON", os.getpid(), flush=True)
        sys.stdin.readline()
        manager.close()
    """)
    procs = [forked_io.code(script, stdin_pipe=True, env=ENV) for _ in range(CONTENDERS)]
    try:
        for proc in procs:
            assert forked_io.lines(proc, 1, timeout=120) == ["ready"]
        go.touch()
        lines = {proc.pid: forked_io.lines(proc, 2, timeout=120)[1].strip() for proc in procs}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.stdin.write(b"\n")
                proc.stdin.flush()
            proc.wait(timeout=60)
    winners = [pid for pid, line in lines.items() if line.startswith("WON")]
    losers = [line for line in lines.values() if line.startswith("LOST")]
    assert len(winners) == 1 and len(losers) == CONTENDERS - 1, lines
    for line in losers:
        assert f"pid {winners[0]} " in line and f"pid {dead_pid} " not in line, line
