"""The eval events file after a failed write (issue 21.8) and eval directories holding what is not
an events file (issue 21.4): every later evaluation stays readable by TensorBoard, and reading
never blocks on a FIFO."""
from __future__ import annotations

import errno
import os
import subprocess
import threading
import uuid

import pytest

from supervisor.estimator.metrics import EvalEventsFile, read_eval_events
from supervisor.estimator.sidecar import evaluated_steps
from tests import zygote
from tests.estimator.estimator_toy import eval_scalars

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def metrics(step: int, tags: int = 40) -> dict[str, float]:
    # ~40 tags: a record of ~1 KiB, so a full page of the file tears a record in two
    return {f"metric_{i:02d}": step + i / 100 for i in range(tags)}


def fill(path: str) -> None:
    """Writes ``path`` until its file system is full."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 256 KiB tmpfs (root only; skipped with the reason where it cannot be mounted)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True, timeout=60)


def test_a_disk_full_write_leaves_every_later_evaluation_readable(tiny_tmpfs):
    eval_dir = str(tiny_tmpfs / "eval")
    events = EvalEventsFile(eval_dir)
    events.write(metrics(1), 1)
    filler = str(tiny_tmpfs / "filler")
    fill(filler)
    written, failed = [1], None
    for step in range(2, 40):
        try:
            events.write(metrics(step), step)
            written.append(step)
        except OSError as e:
            assert e.errno == errno.ENOSPC and eval_dir in str(e) and f"step {step}" in str(e), e
            failed = step
            break
    assert failed is not None, "the file system never filled up"
    os.remove(filler)  # space again: the next evaluations are written, into a new events file
    for step in range(failed + 1, failed + 4):
        events.write(metrics(step), step)
        written.append(step)
    assert [s for s, _ in eval_scalars(eval_dir)["metric_00"]] == written  # TensorBoard reads them all
    assert sorted(read_eval_events(eval_dir)) == written
    assert evaluated_steps(eval_dir) == set(written)


_FILE_SIZE_LIMIT = """
import resource, signal, sys
from supervisor.estimator.metrics import EvalEventsFile

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
events = EvalEventsFile(sys.argv[1])
metrics = {f"metric_{i:02d}": float(i) for i in range(40)}
events.write(metrics, 1)
resource.setrlimit(resource.RLIMIT_FSIZE, (2500, resource.RLIM_INFINITY))  # fits ~2 records
failures = []
for step in range(2, 8):
    try:
        events.write(metrics, step)
    except OSError as e:
        failures.append(step)
print(failures)
"""


def test_a_write_failing_inside_the_os_write_starts_a_new_events_file(tmp_path):
    """The OS refuses the middle of a record (the file-size limit, ``RLIMIT_FSIZE``): the record is
    torn, and the evaluations after it go to a new file every reader can read."""
    eval_dir = str(tmp_path / "eval")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = zygote.python(["-c", _FILE_SIZE_LIMIT, eval_dir], env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = eval(done.stdout.strip())
    assert failures, "no write crossed the file-size limit"
    # The write after a failure starts a new file, which the limit lets it write.
    assert all(step + 1 not in failures for step in failures), failures
    written = [s for s in range(1, 8) if s not in failures]
    assert [s for s, _ in eval_scalars(eval_dir)["metric_00"]] == written
    assert sorted(read_eval_events(eval_dir)) == written


def run_bounded(target, *args, fifo: str, timeout: float = 60):
    """Runs ``target(*args)`` in a thread; a call blocked opening ``fifo`` is released (by opening
    its other end) after ``timeout`` so the test fails instead of hanging."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = target(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    blocked = thread.is_alive()
    if blocked:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(60)
    assert not thread.is_alive()
    assert not blocked, f"{target.__name__} blocked opening the FIFO {fifo}"
    return box


@pytest.mark.parametrize("reader", [read_eval_events, evaluated_steps])
def test_a_fifo_among_the_events_files_is_skipped_not_opened(tmp_path, reader, caplog):
    eval_dir = str(tmp_path / "eval")
    EvalEventsFile(eval_dir).write({"loss": 0.5}, 10)
    fifo = os.path.join(eval_dir, f"events.out.tfevents.9999999999.host.{uuid.uuid4().hex[:6]}.eval")
    os.mkfifo(fifo)
    os.symlink("/dev/zero", os.path.join(eval_dir, "events.out.tfevents.9999999999.link"))
    box = run_bounded(reader, eval_dir, fifo=fifo, timeout=20)
    assert "error" not in box, box
    assert set(box["result"]) == {10}
    assert "not a regular file" in caplog.text


def test_the_evaluate_command_is_not_blocked_by_a_fifo_in_its_eval_dir(tmp_path):
    from supervisor.checkpoint.layout.finished import mark_finished
    from tests.estimator.sidecar_helpers import StepTrainer

    trainer = StepTrainer(str(tmp_path / "run"))
    trainer.save(10)
    trainer.close()
    mark_finished(trainer.directory, step=10)
    os.makedirs(tmp_path / "run" / "eval")
    os.mkfifo(tmp_path / "run" / "eval" / "events.out.tfevents.1.host.1.eval")
    data = tmp_path / "data.py"
    data.write_text("import torch\ndef batches():\n    return [torch.ones(2, 8)] * 3\n")
    helpers = "tests.estimator.sidecar_helpers"
    try:
        done = zygote.python(["-m", "supervisor.cli.evaluate", trainer.directory, "--model", f"{helpers}:make_model",
                              "--data", f"{data}:batches", "--eval-step", f"{helpers}:weight_metrics", "--poll-secs",
                              "0.05"], timeout=90, cwd=REPO,
                             env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    except subprocess.TimeoutExpired:
        pytest.fail("evaluate blocked on the FIFO in LOGDIR/eval")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "stopped (finished): 1 evaluated" in done.stdout
    assert "not a regular file" in done.stderr
