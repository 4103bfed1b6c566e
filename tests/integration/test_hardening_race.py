"""Issue 9 finding 3 with real processes: a reader racing a trainer that saves every step with
``max_to_keep=1`` never reports a healthy checkpoint as corrupt. A checkpoint retention deletes
while it is read raises `CheckpointVanishedError` (or is passed over by the iterator) and the
reader moves on to the next. The counts are printed (``pytest -s``) and asserted."""
from __future__ import annotations

import json
import re
import os
import time

import pytest

from tests import forked_io, zygote

ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
RACE_SECS = 10  # ~170 saves and ~90 iterator yields on a loaded 2-core machine: 3x the floors asserted

TRAINER = """
import sys, time, torch
from supervisor import TrainingState
from supervisor.checkpoint import CheckpointManager
logdir, secs = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
state = TrainingState({"model": torch.nn.Linear(128, 128)})
with CheckpointManager(logdir, max_to_keep=1) as manager:
    manager.save(0, state, wait=True)
    print("first", flush=True)
    start, step = time.monotonic(), 0
    while time.monotonic() - start < secs:
        step += 1
        with torch.no_grad():
            state["model"].weight.add_(1.0)
        manager.save(step, state)  # every step; retention deletes the previous one
print("saves", step, flush=True)
"""

READER = """
import json, sys, threading, time
import supervisor.errors as errors
from supervisor.checkpoint import checkpoints_iterator, latest_checkpoint, load_checkpoint, verify_checkpoint
logdir, out = sys.argv[1], sys.argv[2]
VANISHED = getattr(errors, "CheckpointVanishedError", type("NeverRaised", (Exception,), {}))
counts = {k: 0 for k in ("loads", "load_vanished", "yields", "yield_loads", "yield_vanished", "verifies",
                         "verify_vanished", "not_found", "corrupt")}
corrupt_messages = []
done = threading.Event()
lock = threading.Lock()

def count(key, message=None):
    with lock:
        counts[key] += 1
        if message is not None and len(corrupt_messages) < 5:
            corrupt_messages.append(message)

def read(key, vanished_key, fn):
    path = latest_checkpoint(logdir)
    if path is None:
        return
    try:
        fn(path)
        count(key)
    except VANISHED:
        count(vanished_key)  # deleted meanwhile: the next look at the index finds the newer one
    except errors.CheckpointCorruptError as e:
        count("corrupt", str(e))
    except errors.CheckpointNotFoundError:
        count("not_found")

def loader():
    while not done.is_set():
        read("loads", "load_vanished", load_checkpoint)

def verifier():
    while not done.is_set():
        read("verifies", "verify_vanished", verify_checkpoint)

def iterate():
    for path in checkpoints_iterator(logdir, timeout=3, poll_secs=0.005):
        count("yields")
        try:
            load_checkpoint(path)
            count("yield_loads")
        except VANISHED:
            count("yield_vanished")
        except errors.CheckpointCorruptError as e:
            count("corrupt", str(e))
        except errors.CheckpointNotFoundError:
            count("not_found")
    done.set()

threads = [threading.Thread(target=f) for f in (loader, verifier, iterate)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open(out, "w") as f:
    json.dump({"counts": counts, "corrupt_messages": corrupt_messages}, f)
"""


@pytest.mark.slow
def test_readers_racing_retention_never_see_a_corrupt_checkpoint(tmp_path):
    logdir, out = str(tmp_path / "run"), str(tmp_path / "counts.json")
    (tmp_path / "trainer.py").write_text(TRAINER)
    (tmp_path / "reader.py").write_text(READER)
    trainer = zygote.Forked(str(tmp_path / "trainer.py"), [logdir, RACE_SECS], output=str(tmp_path / "trainer.out"),
                            env=forked_io.unbuffered(ENV))
    reader = None
    try:
        assert forked_io.wait_for(trainer, "first\n", timeout=120).startswith("first\n")
        reader = zygote.Forked(str(tmp_path / "reader.py"), [logdir, out], output=str(tmp_path / "reader.out"),
                               env=ENV)
        start = time.monotonic()
        trainer_out = forked_io.communicate(trainer, timeout=RACE_SECS + 120)
        raced_secs = time.monotonic() - start
        reader.wait(timeout=120)
    finally:
        for proc in (trainer, reader):
            if proc is not None:
                forked_io.finish(proc, timeout=30)
    assert trainer.returncode == 0 and reader.returncode == 0, trainer_out
    saves = int(re.findall(r"^saves (\d+)$", trainer_out, re.M)[-1])  # the trainer's own line, not a log line
    result = json.load(open(out))
    counts = result["counts"]
    vanished = counts["load_vanished"] + counts["yield_vanished"] + counts["verify_vanished"]
    print(f"\nrace of {raced_secs:.0f} s (loaded machine, noisy): {saves} saves with max_to_keep=1; reader "
          f"{counts['loads']} latest->load, {counts['yields']} iterator yields ({counts['yield_loads']} loaded), "
          f"{counts['verifies']} verifies; vanished while read: {vanished} ({counts['load_vanished']} load, "
          f"{counts['yield_vanished']} yield-load, {counts['verify_vanished']} verify); "
          f"not found: {counts['not_found']}; corrupt: {counts['corrupt']}")
    assert raced_secs >= RACE_SECS
    assert counts["corrupt"] == 0, result["corrupt_messages"]
    assert saves > 50 and counts["loads"] > 20 and counts["yields"] > 5 and counts["verifies"] > 20, counts
