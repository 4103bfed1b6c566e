"""tests/zygote.py, the suite's way of starting ``python`` subprocesses: a forked child must look
like a fresh interpreter wherever the tests rely on it (exit status, signals, environment, seeds,
threads, stdin, buffering), and refuse what a fork cannot give (another checkout on PYTHONPATH)."""
from __future__ import annotations

import os
import signal
import sys
import time

from tests import zygote

_DRAWS = "import random, numpy, torch; print(random.random(), float(numpy.random.random()), torch.rand(1).item())"


def test_a_child_runs_code_scripts_and_modules_with_their_exit_status_and_streams(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('out', sys.argv[1:])\nprint('err', file=sys.stderr)\nsys.exit(3)\n")
    done = zygote.python([script, "a", "b"], timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out ['a', 'b']\n", "err\n")
    done = zygote.python(["-c", "raise ValueError('boom')"], timeout=60)
    assert done.returncode == 1 and "ValueError: boom" in done.stderr
    done = zygote.python(["-m", "supervisor", "--help"], timeout=60)
    assert done.returncode == 0 and "usage" in done.stdout


def test_each_child_gets_its_own_seeds_environment_and_thread_count_as_a_fresh_interpreter(tmp_path):
    first, second = (zygote.python(["-c", _DRAWS], timeout=60).stdout.split() for _ in range(2))
    assert [a != b for a, b in zip(first, second)] == [True] * 3  # random, numpy, torch: seeded from the OS
    env = dict(os.environ, OMP_NUM_THREADS="1", ZYGOTE_PROBE="x")
    done = zygote.python(["-c", "import os, torch; print(torch.get_num_threads(), os.environ['ZYGOTE_PROBE'], "
                          "os.getcwd())"], timeout=60, env=env, cwd=str(tmp_path))
    assert done.stdout.split() == ["1", "x", str(tmp_path)], done.stderr


def test_a_forked_process_can_be_signalled_fed_on_stdin_and_read_while_it_runs(tmp_path):
    out = str(tmp_path / "out.log")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = zygote.Forked(None, [], module="tests.zygote_echo", output=out, env=env, stdin_pipe=True,
                         new_session=True)
    proc.stdin.write(b"hello\n")
    polls = 0
    while "echo hello" not in open(out).read():  # unbuffered: the line is there while it runs
        polls += 1
        assert proc.poll() is None and polls < 12000, open(out).read()
        time.sleep(0.005)
    assert os.getpgid(proc.pid) == proc.pid  # its own session and process group
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGCONT)
    proc.kill_group()
    assert proc.wait(60) == -signal.SIGKILL


def test_another_checkout_on_pythonpath_is_refused_not_silently_ignored(tmp_path):
    (tmp_path / "supervisor").mkdir()
    done = zygote.python(["-c", "print('ran')"], timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert done.returncode == 1 and "another checkout" in done.stderr and "ran" not in done.stdout
    (tmp_path / "plugin_only").mkdir()
    (tmp_path / "plugin_only" / "zygote_plugin.py").write_text("NAME = 'plugin'\n")
    done = zygote.python(["-c", "import zygote_plugin; print(zygote_plugin.NAME)"], timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path / "plugin_only")))
    assert done.stdout == "plugin\n", done.stderr
    assert sys.executable in done.args
