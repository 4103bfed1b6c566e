"""Naming the rank that failed (SPEC §12): when a collective fails, ask the store who is left.

A rank that raises posts its error under ``failed/<rank>`` in the group's store as it closes
its session; every rank that sees a collective fail posts ``alive/<rank>``. A rank that posted
neither within a short grace period is unresponsive: killed (its `HangWatchdog` heartbeat has
stopped: it is not waited for) or hung (its heartbeat goes on). The store is the one the
process group rendezvoused on, so this needs no connection of its own. Under torchrun, a
`RankFailureError` that leaves the program ends the process at once after its traceback
(`exit_at_once_on_rank_failure`).

Whatever fails first on a surviving rank — the agreement's collective, DDP's all-reduce, gloo's
transport timeout ("Application timeout caused pair closure", "Timed out waiting ... for recv"),
a sharded save's ``dcp.save`` ("Connection closed by peer") — the error it raises names the
failed rank: the agreement's ``close`` turns a collective failure into a `RankFailureError`
naming the rank(s) found here, chained to the original error (`explain_collective_failure`).
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Any

from supervisor.errors import SupervisorError

__all__ = ["RankFailureError", "diagnose", "post_failure", "is_collective_failure", "exit_at_once_on_rank_failure"]

logger = logging.getLogger(__name__)

#: How often each rank's `HangWatchdog` posts its heartbeat (at most ``stop_grace_secs / 4``).
HEARTBEAT_SECS = 1.0


class RankFailureError(SupervisorError):
    """Another rank failed (raised, was killed or hung) and this rank cannot go on.

    Attributes:
        ranks: the ranks found failed or unresponsive (empty when the store could not tell).
        step: the step at which this rank noticed.
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), step: int | None = None) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.step = step


def post_failure(store: Any, rank: int, message: str) -> None:
    """Tells the other ranks this rank is leaving because of ``message`` (best effort)."""
    try:
        store.set(f"failed/{rank}", message[:2000])
    except Exception as e:  # noqa: BLE001 - the store's host may be the one that died
        logger.debug("could not post rank %d's failure to the store: %s", rank, e)


def diagnose(store: Any, rank: int, world_size: int, *, grace_secs: float,
             beating: set[int] | None = None,
             heartbeat_secs: float = HEARTBEAT_SECS) -> tuple[dict[int, str], list[int]]:
    """Returns ``({rank: its posted error}, [unresponsive ranks])`` as seen within ``grace_secs``.
    ``beating``, when given, receives the unresponsive ranks whose heartbeat changed meanwhile
    (alive, so hung or blocked, not killed).

    The wait ends early once every unresponsive rank is dead: its `HangWatchdog` heartbeat
    (posted every ``heartbeat_secs``) has not changed for two intervals since this call first
    read it. A killed rank is then named in about ``2 × heartbeat_secs`` (2 s), not after the
    whole window (up to 5 s: ``min(5, stop_grace_secs / 4)``); a rank that still beats, or never
    posted a heartbeat, is waited for until ``grace_secs`` have passed."""
    try:
        store.set(f"alive/{rank}", "1")
    except Exception as e:  # noqa: BLE001
        logger.warning("the process group's store is unreachable (%s); its host (rank 0 or the "
                       "torchrun agent) may be gone", e)
        return {}, [r for r in range(world_size) if r != rank and r == 0]
    failed: dict[int, str] = {}
    beats: dict[int, tuple[bytes | None, float]] = {}
    changed: set[int] = set()
    start = time.monotonic()
    while True:
        silent = _unanswered(store, rank, world_size, failed)
        now = time.monotonic()
        dead = [r for r in silent if _stopped_beating(store, r, beats, changed, now, 2 * heartbeat_secs)]
        if len(dead) == len(silent) or now - start >= grace_secs:
            if beating is not None:
                beating.update(r for r in silent if r in changed)
            return failed, silent
        time.sleep(0.05)


def _unanswered(store: Any, rank: int, world_size: int, failed: dict[int, str]) -> list[int]:
    """The ranks that posted neither an error (added to ``failed``) nor ``alive``."""
    silent = []
    for other in range(world_size):
        if other == rank or other in failed:
            continue
        try:
            if store.check([f"failed/{other}"]):
                failed[other] = store.get(f"failed/{other}").decode("utf-8", "replace")
            elif not store.check([f"alive/{other}"]):
                silent.append(other)
        except Exception:  # noqa: BLE001 - treat an unreadable store as silence
            silent.append(other)
    return silent


def _stopped_beating(store: Any, other: int, beats: dict[int, tuple[bytes | None, float]],
                     changed: set[int], now: float, still_secs: float) -> bool:
    """Whether ``other``'s heartbeat has stayed the same for ``still_secs`` since first read here
    (a rank with no heartbeat, or one that closed its agreement, is never called dead here)."""
    try:
        value = store.get(f"heartbeat/{other}") if store.check([f"heartbeat/{other}"]) else None
    except Exception:  # noqa: BLE001 - an unreadable store proves nothing
        return False
    seen, since = beats.get(other, (None, now))
    if other not in beats or value != seen:
        if other in beats and value != _CLOSED.encode():
            changed.add(other)
        beats[other] = (value, now)
        return False
    return value is not None and value != _CLOSED.encode() and other not in changed and now - since >= still_secs


def describe_failure(failed: dict[int, str], silent: list[int], grace_secs: float,
                     beating: set[int] | None = None) -> str:
    """One sentence naming each failed rank and why (``beating``: the silent ranks whose
    heartbeat goes on, i.e. hung; without it a silent rank is "killed or hung")."""
    parts = [f"rank {r} failed ({message})" for r, message in sorted(failed.items())]
    for group, waited, why in _silent_groups(silent, beating):
        within = f" within {grace_secs:g} s" if waited else ""  # a stopped heartbeat is not waited for
        parts.append(f"rank {', '.join(str(r) for r in group)} did not respond{within} ({why})")
    return "; ".join(parts) if parts else "no rank reported a failure (a network problem?)"


def _silent_groups(silent: list[int], beating: set[int] | None) -> list[tuple[list[int], bool, str]]:
    if beating is None:
        return [(silent, True, "killed or hung")] if silent else []
    hung = [r for r in silent if r in beating]
    gone = [r for r in silent if r not in beating]
    groups = [(gone, False, "killed, or its host is gone: its heartbeat stopped")] if gone else []
    if hung:
        groups.append((hung, True, "alive, its heartbeat goes on, but not answering: hung, or still blocked in a collective"))
    return groups


_COLLECTIVE_MARKERS = ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "pair closure",
                       "Timed out waiting", "Broken pipe")


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` — or an error it was raised from — looks like a torch.distributed
    collective or store call that failed because a peer is gone or hung."""
    import torch.distributed as dist

    dist_error = getattr(dist, "DistError", None)
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if dist_error is not None and isinstance(exc, dist_error):
            return True
        if isinstance(exc, (RuntimeError, OSError, SupervisorError)) or type(exc).__name__ == "CheckpointException":
            if any(marker in str(exc) for marker in _COLLECTIVE_MARKERS):
                return True
        exc = exc.__cause__ or exc.__context__
    return False


_CLOSED = "closed"


class HangWatchdog:
    """Ends this process when another rank hangs while this one is blocked waiting for it.

    ``torch.distributed`` cannot interrupt a blocked gloo collective (``abort`` does not unblock
    it), so a rank stuck in DDP's all_reduce behind a hung peer would wait for the training
    group's own timeout (30 min by default). Every rank posts, from this thread, a heartbeat
    (``heartbeat/<rank>`` = ``"<counter> <step of its last boundary> <seconds at that step>"``,
    every interval). When this rank's step has not moved for ``grace_secs`` *and* another rank
    is behind it and has been at its step for more than ``grace_secs`` (by its own heartbeat,
    so it is named at once, not ``grace_secs`` after this rank started looking), that rank is
    hung: this rank logs an error naming it, posts it for the
    others, and exits with status 1 (as NCCL's watchdog does), so torchrun — or whoever started
    the job — sees the failure in bounded time. Committed checkpoints are untouched; a save in
    flight is left as a temp directory, removed at the next start.

    A rank that is *gone* (SIGKILL, OOM killer) may have reached the same step as this one before
    it died — e.g. killed by its own checkpoint writer thread while its training thread ran on —
    and then it is not "behind". So the heartbeat also counts (``closed`` when the agreement
    closes normally): once this rank's step has not moved for one interval, it reads every
    other rank's heartbeat once; when another rank's heartbeat is still the same ``grace_secs``
    later (this rank's step not having moved meanwhile), that rank is dead or frozen (SIGSTOP),
    and this rank exits the same way — about ``grace_secs`` + 1–2 intervals after the peer
    stopped, not 2 × ``grace_secs`` (issue 25.5). Between that first read and ``grace_secs`` of
    stillness nothing is read: a heartbeat's counter never repeats, so two reads tell whether it
    changed in between. The peers are thus read once per still interval and then only while this
    rank is blocked, not each second by every rank (world_size² requests on the store); a job
    whose steps last longer than an interval pays one read of world_size keys per step and rank.
    A rank blocked in a collective still beats (its threads run), so a heartbeat never stops
    because a rank waits.
    """

    def __init__(self, store: Any, rank: int, world_size: int, *, grace_secs: float,
                 interval_secs: float = HEARTBEAT_SECS) -> None:
        self._store, self.rank, self.world_size = store, rank, world_size
        self.grace_secs = grace_secs
        self._interval = min(interval_secs, grace_secs / 4)
        self._step: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-rank-watchdog", daemon=True)

    def start(self) -> None:
        # The first heartbeat now, not an interval later: a rank killed within its first second
        # (its writer thread, a short run) would otherwise leave no key, and no silence to see.
        try:
            self._store.set(f"heartbeat/{self.rank}", "0")
        except Exception as e:  # noqa: BLE001 - the store's host may be gone: the collectives report it
            logger.debug("rank watchdog: store unavailable (%s)", e)
        exit_at_once_on_rank_failure()
        self._thread.start()

    def progress(self, step: int) -> None:
        """The training thread reached the boundary of ``step`` (a plain attribute write)."""
        self._step = step

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:  # a rank that left normally is not "silent"
            self._store.set(f"heartbeat/{self.rank}", _CLOSED)
        except Exception as e:  # noqa: BLE001 - the store's host may be gone already
            logger.debug("rank watchdog: could not post the close (%s)", e)

    def _run(self) -> None:
        beats: dict[int, tuple[str, float]] = {}
        posted = None
        own_since = time.monotonic()
        beat = 0
        while not self._stop.wait(self._interval):
            now = time.monotonic()
            step = self._step
            beat += 1
            if step != posted:
                posted, own_since = step, now
            try:
                self._store.set(f"heartbeat/{self.rank}", f"{beat} {-1 if step is None else step} {now - own_since:.1f}")
                blocked = now - own_since > self.grace_secs
                if now - own_since < self._interval / 2:
                    beats.clear()  # this rank moved: silence counts from its next still interval
                peers = self._read_peers() if blocked or (not beats and now > own_since) else {}
                silent = self._find_silent(peers, beats, now)
                hung = self._find_hung(step, peers) if blocked and silent is None else None
            except Exception as e:  # noqa: BLE001 - the store's host may be gone: the collectives report it
                logger.debug("rank watchdog: store unavailable (%s)", e)
                continue
            if silent is not None:
                self._abort_silent(silent)
            if hung is not None:
                self._abort(*hung)

    def _read_peers(self) -> dict[int, str]:
        """Every other rank's heartbeat, as posted (ranks that posted none are left out)."""
        peers = {}
        for other in range(self.world_size):
            if other != self.rank and self._store.check([f"heartbeat/{other}"]):
                peers[other] = self._store.get(f"heartbeat/{other}").decode()
        return peers

    def _find_silent(self, peers: dict[int, str], beats: dict[int, tuple[str, float]], now: float) -> int | None:
        """A rank whose heartbeat has not changed for ``grace_secs`` since this rank saw it
        (read when this rank goes still, then every interval once it is blocked)."""
        for other, value in peers.items():
            if beats.get(other, (None, 0.0))[0] != value:
                beats[other] = (value, now)
            elif value != _CLOSED and now - beats[other][1] > self.grace_secs:
                return other
        return None

    def _abort_silent(self, other: int) -> None:
        self._exit(f"rank {other} stopped responding: no heartbeat for more than stop_grace_secs="
                   f"{self.grace_secs:g} s (killed, or its process is frozen) while rank {self.rank} waits "
                   f"at step {self._step}; rank {self.rank} exits (status 1) so the job ends")

    def _find_hung(self, step: int | None, peers: dict[int, str]) -> tuple[int, int] | None:
        """A rank behind this one that has been at its step for more than ``grace_secs``."""
        for other, value in peers.items():
            parts = value.split()
            if step is None or len(parts) != 3:  # "closed", or not yet at a boundary
                continue
            other_step, at_step_secs = int(parts[1]), float(parts[2])
            if other_step < step and at_step_secs > self.grace_secs:
                return other, other_step
        return None

    def _abort(self, other: int, other_step: int) -> None:
        self._exit(f"rank {other} hung: it has been at step {other_step} for more than "
                   f"stop_grace_secs={self.grace_secs:g} s while rank {self.rank} waits for it at "
                   f"step {self._step}; rank {self.rank} exits (status 1) so the job ends")

    def _exit(self, message: str) -> None:
        logger.critical("%s", message)
        post_failure(self._store, self.rank, message)
        _flush_output()
        print(f"RankFailureError: {message}", file=sys.stderr, flush=True)
        os._exit(1)


def _flush_output() -> None:
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - a broken handler must not keep the process alive
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass


_previous_excepthook: Any = None


def exit_at_once_on_rank_failure() -> None:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set), makes an uncaught `RankFailureError` end
    the process as soon as its traceback is printed: ``atexit`` handlers run, logs and stdio are
    flushed, then ``os._exit(1)`` skips the interpreter's and torch's teardown — seconds of CPU
    on a loaded host (issue 25.5: 3–5 s of the 4–8 s a killed rank cost), while torchrun waits
    for this process before it restarts the job. Installed by `HangWatchdog.start` (so only by a
    `CollectiveAgreement`); idempotent; other exceptions, and a `RankFailureError` the program
    catches, go on as before.

    It is safe for checkpoints: a `RankFailureError` leaves the session only after the session
    closed, and closing settles the save in flight (the manager's ``close`` finishes it:
    committed whole, or not at all — a commit is a rename). Non-daemon threads still running
    are not joined (torchrun, whose SIGTERM reached this rank as the other one failed, would
    SIGKILL them 30 s later anyway)."""
    global _previous_excepthook
    if not os.environ.get("TORCHELASTIC_RUN_ID") or _previous_excepthook is not None:
        return
    _previous_excepthook = sys.excepthook
    sys.excepthook = _exit_after_rank_failure


def _exit_after_rank_failure(exc_type: Any, exc: BaseException, tb: Any) -> None:
    _previous_excepthook(exc_type, exc, tb)  # the traceback, as Python prints it
    if not _raised_by_rank_failure(exc):
        return
    print("RankFailureError: exiting now (status 1), skipping the interpreter's teardown", file=sys.stderr)
    try:
        atexit._run_exitfuncs()
    finally:
        _flush_output()
        os._exit(1)


def _raised_by_rank_failure(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RankFailureError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
