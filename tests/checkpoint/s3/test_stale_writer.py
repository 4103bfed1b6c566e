"""A paused lease holder's late writes (issue 30 item 2, SPEC §16 "never two writers committing"),
against the real moto server, the real s3fs client and real processes.

Writer 1 passes its pre-commit lease check for step 2 and sends its create-only ``MANIFEST.json``
PUT, which a loopback proxy holds; writer 1 is SIGSTOPped (a GC pause, a VM freeze, ``scontrol
suspend``) until its lease expired and writer 2 — another process, with another host's identity —
took the logdir over. Then writer 1 is SIGCONTed and its held PUT released: before writer 2 saves
anything, after it saved steps 2 and 3, or while it saves them; or writer 1's held manifest is
its very first (there is no index yet) and lands before writer 2 saves. Whatever the moment, the late
writes are fenced: writer 2 (the rightful holder) never dies, every checkpoint the index lists
verifies and holds writer 2's state (writer 1's only for step 1, committed while it held the
lease), and a restore gets writer 2's newest.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("s3fs", reason='the object-store tests need the test extra: pip install -e ".[test]"')

from supervisor.checkpoint import read_checkpoint, read_index  # noqa: E402
from supervisor.checkpoint.load.choose import find_and_load  # noqa: E402
from tests import zygote  # noqa: E402
from tests.s3_fixtures import FaultProxy  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
WRITER = os.path.join(HERE, "fenced_writer.py")
TRIES = 12
#: Tries run at once: each mostly waits, idle, for writer 1's lease to run out (a lease long enough
#: that writer 1's own renewals keep it on a loaded machine until the test pauses it).
CONCURRENT = 4
#: Writer 1's lease is short (writer 2 takes over once it ran out); writer 2's is long, so that on a
#: loaded machine its own renewals cannot fall behind (that is the lease's own margin, tested elsewhere).
LEASE_SECS = {"stale": 8.0, "rightful": 30.0}
WAIT_SECS = 90.0
#: When writer 1 resumes and its held manifest PUT reaches the server, relative to writer 2.
MOMENTS = ("before writer 2 saves", "after writer 2 saved steps 2 and 3", "while writer 2 saves",
           "its first checkpoint, before writer 2 saves")


class HoldingProxy(FaultProxy):
    """A loopback proxy in front of the server that holds the first PUT of ``<held>`` (a key
    ending) until `release`; ``holding`` is set once it holds it. Everything else is forwarded."""

    def __init__(self, upstream_port: int, held: str) -> None:
        super().__init__(upstream_port)
        self.holding, self.released = threading.Event(), threading.Event()
        self._key, self._armed = held, True
        self.intercept = self._hold

    def _hold(self, command: str, path: str) -> None:
        with self.lock:
            hold = self._armed and command == "PUT" and path.split("?", 1)[0].endswith(self._key)
            self._armed = self._armed and not hold
        if hold:
            self.holding.set()
            self.released.wait(WAIT_SECS * 2)

    def release(self) -> None:
        self.released.set()

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        super().__exit__(*exc)


def _start(role: str, logdir: str, endpoint: str, signals: str, *extra: str) -> tuple[zygote.Forked, str]:
    out = os.path.join(signals, f"{role}.out")
    process = zygote.Forked(WRITER, [role, logdir, endpoint, LEASE_SECS[role], signals, *extra], output=out,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])})
    return process, out


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _until(what: str, done, process: zygote.Forked, out: str) -> bool:
    """Waits (bounded) for ``done()``; False when the process ended first."""
    deadline = time.monotonic() + WAIT_SECS
    while not done():
        if process.poll() is not None:
            return done()
        assert time.monotonic() < deadline, f"no {what} within {WAIT_SECS:g} s: {_read(out)}"
        time.sleep(0.02)
    return True


def _touch(signals: str, name: str) -> None:
    open(os.path.join(signals, name), "w").close()


def _stop(process: zygote.Forked) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
    process.wait(30)


def _one_try(moment: str, server, storage, logdir: str, signals: str) -> dict:
    """Writer 1 held and paused, writer 2 taking over, writer 1's late PUT released at ``moment``;
    returns what each writer printed and its status."""
    os.makedirs(signals)
    first = moment == MOMENTS[3]
    with HoldingProxy(server.port, f"/model.ckpt-{1 if first else 2}/MANIFEST.json") as proxy:
        stale, stale_out = _start("stale", logdir, proxy.endpoint, signals, *(["first"] if first else []))
        rightful = None
        try:
            assert _until("READY", lambda: "READY" in _read(stale_out), stale, stale_out), _read(stale_out)
            _touch(signals, "go")
            assert proxy.holding.wait(WAIT_SECS), f"writer 1 never sent its manifest PUT: {_read(stale_out)}"
            os.kill(stale.pid, signal.SIGSTOP)  # past its pre-commit check, its PUT in flight
            rightful, rightful_out = _start("rightful", logdir, server.endpoint, signals)
            saved = lambda: "SAVED" in _read(rightful_out)  # noqa: E731
            alive = _until("OPENED", lambda: "OPENED" in _read(rightful_out), rightful, rightful_out)
            if alive and moment == MOMENTS[1]:
                _touch(signals, "go2")
                alive = _until("SAVED", saved, rightful, rightful_out)
            os.kill(stale.pid, signal.SIGCONT)
            proxy.release()
            if moment in (MOMENTS[0], MOMENTS[3]):
                stale.wait(WAIT_SECS)
            _touch(signals, "go2")
            alive = alive and _until("SAVED", saved, rightful, rightful_out)
            stale.wait(WAIT_SECS)
            _touch(signals, "released")
            rightful.wait(WAIT_SECS)
            return {"stale": (stale.returncode, _read(stale_out)), "rightful": (rightful.returncode, _read(rightful_out))}
        finally:
            _stop(stale)
            if rightful is not None:
                _stop(rightful)


def _weight(payload: dict) -> float:
    return float(payload["model"]["weight"].flatten()[0])


def _indexed_problems(storage, logdir: str) -> list[str]:
    """What is wrong with the index: every checkpoint it lists must verify and hold writer 2's
    state (writer 1's for step 1), and it must name step 5."""
    try:
        index = read_index(logdir, storage)
    except (OSError, ValueError) as e:
        return [f"the index cannot be read: {e}"]
    problems = [] if index.model_checkpoint_path == "model.ckpt-5" else [f"the index names {index.model_checkpoint_path}"]
    for name in dict.fromkeys((*index.all_model_checkpoint_paths, index.model_checkpoint_path)):
        try:
            read = read_checkpoint(f"{logdir}/{name}", storage=storage)
        except Exception as e:  # noqa: BLE001 - counted
            problems.append(f"{name} does not verify: {type(e).__name__}: {e}")
            continue
        expected = 1.0 if read.step == 1 else 100.0 + read.step
        if _weight(read.payload) != expected:
            problems.append(f"{name} holds {_weight(read.payload)}, not writer 2's {expected}")
    return problems


def test_a_paused_holders_late_manifest_neither_commits_nor_moves_the_index_nor_kills_the_new_holder(
        s3_server, s3_root, s3_storage, tmp_path):
    # The tries are independent (each its own logdir, proxy, writers and signal files) and mostly
    # wait for writer 1's lease to run out, so CONCURRENT of them run at once; checked one by one.
    with ThreadPoolExecutor(CONCURRENT) as pool:
        tries = [pool.submit(_one_try, MOMENTS[number % len(MOMENTS)], s3_server, s3_storage,
                             f"{s3_root}/run-{number}", str(tmp_path / f"try-{number}")) for number in range(TRIES)]
        seen_by_try = [future.result() for future in tries]
    outcomes = []
    for number, seen in enumerate(seen_by_try):
        moment = MOMENTS[number % len(MOMENTS)]
        logdir = f"{s3_root}/run-{number}"
        rightful_code, rightful_out = seen["rightful"]
        problems = [] if rightful_code == 0 and "DONE" in rightful_out else [f"writer 2 died: {rightful_out.strip().splitlines()[-1:]}"]
        problems += _indexed_problems(s3_storage, logdir)
        stale_out = seen["stale"][1]
        problems += [f"writer 1 reported a commit after losing its lease: {line}"
                     for line in stale_out.splitlines() if line.startswith("SAVED")]
        try:
            restored = find_and_load(logdir, "model.ckpt", storage=s3_storage)
        except Exception as e:  # noqa: BLE001 - counted
            restored, problems = None, problems + [f"a restore failed: {type(e).__name__}: {e}"]
        if restored is None or restored.step != 5 or _weight(restored.payload) != 105.0:
            problems.append(f"a restore got {restored and (restored.step, _weight(restored.payload))}")
        outcomes.append((number, moment, problems, stale_out.strip().splitlines()[-2:]))
    failed = [o for o in outcomes if o[2]]
    assert not failed, "\n".join(f"try {n} ({m}): {p}; writer 1: {s}" for n, m, p, s in failed)
    assert len(outcomes) == TRIES
