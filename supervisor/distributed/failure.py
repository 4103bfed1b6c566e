"""Naming the rank that failed (SPEC §12, issue 31): when a collective fails, ask who is left.

Every report goes to the roll (`supervisor.distributed.roll`), one aggregated record in the
group's store: a rank that raises posts its own error there as it closes its session (a
*primary* failure); a rank whose collective failed because of another (gloo's "Connection reset
by peer", a transport timeout) posts itself as *secondary*, and sets the diagnosis key, which
every live rank's responder answers at once. So a survivor tells apart, in a second or two and
O(1) requests: the ranks that raised, the ranks that stopped because of them (never blamed:
issue 31.3), the ranks alive but stuck (hung), and the ranks that never answer (killed or
frozen). `RankFailureError.ranks` are the primary, blamed and unanswering ranks, else the hung
ones; ``secondary`` the others that stopped. Under torchrun, a `RankFailureError` that leaves the
program ends the process at once after its traceback (`exit_at_once_on_rank_failure`).

Whatever fails first on a surviving rank — the agreement's collective, DDP's all-reduce, gloo's
transport timeout ("Application timeout caused pair closure", "Timed out waiting ... for recv"),
a sharded save's ``dcp.save`` ("Connection closed by peer") — the error it raises names the
failed rank: the agreement's ``close`` turns a collective failure into a `RankFailureError`
naming the rank(s) found here, chained to the original error.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from typing import Any

from supervisor.distributed import roll
from supervisor.distributed.diagnosis import (
    CLOSED,
    HEARTBEAT_SECS,
    describe_failure,
    diagnose,
    post_blame,
    post_failure,
    post_secondary,
)

__all__ = ["RankFailureError", "HangWatchdog", "diagnose", "describe_failure", "post_failure", "post_secondary",
           "is_collective_failure", "exit_at_once_on_rank_failure", "HEARTBEAT_SECS"]
from supervisor.errors import SupervisorError


logger = logging.getLogger(__name__)

class RankFailureError(SupervisorError):
    """Another rank failed (raised, was killed or hung) and this rank cannot go on.

    Attributes:
        ranks: the ranks that failed first — raised, were killed, froze or hung — (empty when
            the store could not tell).
        step: the step at which this rank noticed.
        secondary: the other ranks that stopped because of them (their collectives failed too).
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), step: int | None = None,
                 secondary: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.step = step
        self.secondary = secondary


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


class HangWatchdog:
    """Ends this process when another rank hangs while this one is blocked waiting for it.

    ``torch.distributed`` cannot interrupt a blocked gloo collective (``abort`` does not unblock
    it), so a rank stuck in DDP's all_reduce behind a hung peer would wait for the training
    group's own timeout (30 min by default). This thread watches one other rank — the next one,
    ``(rank + 1) % world_size``: a ring, so every rank is watched by exactly one — and costs
    nothing while this rank's steps complete, however long they are (issue 31: no store request
    per step; the agreement's collective is the liveness check while steps complete).

    Liveness on demand: once this rank's step has not moved for more than ``grace_secs`` (it is
    *blocked*: no step may take that long), it pings the watched rank (`roll.ping`: 1 request)
    and reads its answer (``heartbeat/<rank>`` = ``"<ping number> <step of its last boundary>
    <seconds at that step>"``, posted by that rank's `roll.Responder`) each interval (``min(1 s,
    grace_secs / 10)``), pinging again ``grace_secs / 8`` after each answer. When

    - the watched rank answers, is behind this one and has been at its step for more than
      ``grace_secs``: it is hung;
    - or it has not answered a ping within ``grace_secs / 4`` (and did not close its agreement):
      it is gone (SIGKILL, OOM killer) or frozen (SIGSTOP) — named about 1.25 × ``grace_secs``
      + 1–2 intervals after this rank stopped moving;

    this rank blames it on the roll (`supervisor.distributed.roll`), logs an error naming it and
    exits with status 1 (as NCCL's watchdog does), so torchrun — or whoever started the job —
    sees the failure in bounded time. Every other blocked rank reads the roll's count once an
    interval (1 request) and, once a failure is known, exits the same way naming the rank the roll
    blames. Committed checkpoints are untouched; a save in flight is left as a temp directory,
    removed at the next start. ``closed`` is posted when the agreement closes normally.

    ``responder``: this rank's (the agreement's), which answers the pings of the rank watching
    this one; without one, the watchdog starts its own. On a store that cannot open a second
    connection (no responder) it falls back to heartbeats: once still for ``grace_secs / 4``, it
    posts one every ``grace_secs / 8`` and reads the watched rank's (`_tick`).
    """

    def __init__(self, store: Any, rank: int, world_size: int, *, grace_secs: float,
                 interval_secs: float = HEARTBEAT_SECS, responder: roll.Responder | None = None) -> None:
        self._store, self.rank, self.world_size = store, rank, world_size
        self.grace_secs = grace_secs
        self._interval = min(interval_secs, grace_secs / 10)
        self._still_secs = grace_secs / 4  # heartbeats (no responder): beats only once still this long
        self._watched = (rank + 1) % world_size
        self._beats, self._last_beat = 0, float("-inf")
        self._step: int | None = None
        self._posted: int | None = None  # the step as this thread last saw it, and since when
        self._since = time.monotonic()
        self._responder, self._own_responder = responder, responder is None
        self._pinged: tuple[int, float, bool] | None = None  # (number, sent at, answered)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor-rank-watchdog", daemon=True)

    def start(self) -> None:
        # The first heartbeat now: a rank killed before it was ever still leaves a key that
        # never changes, which is what its watcher sees as silence.
        try:
            self._store.set(f"heartbeat/{self.rank}", "0")
        except Exception as e:  # noqa: BLE001 - the store's host may be gone: the collectives report it
            logger.debug("rank watchdog: store unavailable (%s)", e)
        if self._responder is None and roll.supports(self._store):
            self._responder = roll.Responder(self._store, self.rank, lambda: "alive")
        if self._responder is not None:
            self._responder.beat = self._beat
            if self._own_responder:
                self._responder.start()
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
            self._store.set(f"heartbeat/{self.rank}", CLOSED)
        except Exception as e:  # noqa: BLE001 - the store's host may be gone already
            logger.debug("rank watchdog: could not post the close (%s)", e)
        if self._own_responder and self._responder is not None:
            self._responder.close()

    @property
    def _on_demand(self) -> bool:
        return self._responder is not None and self._responder.available

    def _beat(self) -> str | None:
        """This rank's answer to a ping: its step and how long it has been there (None once stopped)."""
        if self._stop.is_set():
            return None
        return f"{-1 if self._posted is None else self._posted} {time.monotonic() - self._since:.1f}"

    def _run(self) -> None:
        seen: dict[int, tuple[str, float]] = {}
        on_demand = self._on_demand
        threshold = self.grace_secs if on_demand else self._still_secs
        while not self._stop.wait(self._interval):
            now, step = time.monotonic(), self._step
            if step != self._posted:
                self._posted, self._since = step, now
                seen.clear()  # this rank moved: silence counts from its next still spell
                self._pinged = None
            if now - self._since < threshold:
                continue  # moving, or a long step: nothing on the store
            try:
                action = self._watch(step, now) if on_demand else self._tick(step, now - self._since, seen, now)
            except Exception as e:  # noqa: BLE001 - the store's host may be gone: the collectives report it
                logger.debug("rank watchdog: store unavailable (%s)", e)
                continue
            if action is not None:
                action()

    def _watch(self, step: int | None, now: float) -> Any:
        """One blocked interval, liveness on demand (class docstring): ping, or read the answer."""
        pinged = self._pinged
        if self._watched != self.rank and (pinged is None or (pinged[2] and now - pinged[1] >= self.grace_secs / 8)):
            number = pinged[0] + 1 if pinged is not None else 1
            self._pinged = (number, now, False)
            roll.ping(self._store, self._watched, number)
        elif pinged is not None and not pinged[2]:
            number, sent, _ = pinged
            key = f"heartbeat/{self._watched}"
            value = self._store.get(key).decode() if self._store.check([key]) else ""
            if value == CLOSED or value.split()[:1] == [str(number)]:
                self._pinged = (number, sent, True)
                hung = self._find_hung(step, {self._watched: value})
                if hung is not None:
                    return lambda: self._abort(*hung)
            elif now - sent >= self.grace_secs / 4:
                return lambda: self._abort_silent(self._watched)
        return self._failure_known()

    def _tick(self, step: int | None, still: float, seen: dict[int, tuple[str, float]], now: float) -> Any:
        """One still interval without a responder: beat (every ``grace_secs / 8``), read the
        watched rank (once when this rank goes still, then each interval once blocked)."""
        if now - self._last_beat >= self.grace_secs / 8:
            self._beats, self._last_beat = self._beats + 1, now
            self._store.set(f"heartbeat/{self.rank}", f"{self._beats} {-1 if step is None else step} {still:.1f}")
        if self._watched in seen and still <= self.grace_secs:
            return None
        value = self._read_watched(seen)
        if value is None:
            return None
        if seen.get(self._watched, (None, 0.0))[0] != value:
            seen[self._watched] = (value, now)
        if still <= self.grace_secs:
            return None
        if value != CLOSED and now - seen[self._watched][1] >= self.grace_secs / 2:
            return lambda: self._abort_silent(self._watched)
        hung = self._find_hung(step, {self._watched: value})
        if hung is not None:
            return lambda: self._abort(*hung)
        return self._failure_known()

    def _read_watched(self, seen: dict[int, tuple[str, float]]) -> str | None:
        """The watched rank's heartbeat (None before it posted one)."""
        if self._watched == self.rank:
            return None
        if self._watched not in seen and not self._store.check([f"heartbeat/{self._watched}"]):
            return None
        return self._store.get(f"heartbeat/{self._watched}").decode()

    def _failure_known(self) -> Any:
        """While blocked: a failure some rank already posted or blamed (1 request while the roll
        is empty), as the action to take, or None."""
        if not roll.supports(self._store) or roll.count(self._store) == 0:
            return None
        view = roll.read(self._store)
        culprits = {**view.blamed, **view.primary}
        culprits.pop(self.rank, None)
        if not culprits:
            return None
        named = ", ".join(f"rank {r} failed ({m[:300]})" for r, m in sorted(culprits.items()))
        return lambda: self._exit(f"{named}; rank {self.rank} waits for it at step {self._step} and exits "
                                  f"(status 1) so the job ends")

    def _abort_silent(self, other: int) -> None:
        how = (f", nor an answer to a ping within {self.grace_secs / 4:g} s" if self._on_demand else "")
        message = (f"rank {other} stopped responding: no heartbeat for more than stop_grace_secs="
                   f"{self.grace_secs:g} s{how} (killed, or its process is frozen) while rank {self.rank} waits "
                   f"at step {self._step}; rank {self.rank} exits (status 1) so the job ends")
        post_blame(self._store, other, message)
        self._exit(message)

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
        message = (f"rank {other} hung: it has been at step {other_step} for more than "
                   f"stop_grace_secs={self.grace_secs:g} s while rank {self.rank} waits for it at "
                   f"step {self._step}; rank {self.rank} exits (status 1) so the job ends")
        post_blame(self._store, other, message)
        self._exit(message)

    def _exit(self, message: str) -> None:
        logger.critical("%s", message)
        post_secondary(self._store, self.rank, message)
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
