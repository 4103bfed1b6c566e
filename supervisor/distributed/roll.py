"""The roll: one aggregated record of who failed, who saw it, and who is still alive (issue 31).

Every rank's answer is appended to one store key (``store.append``: ``<rank>:<kind>,``, about 6
bytes), the failures' messages to a second, and both are counted under a third (``store.add``):
a rank learns the whole job's state of a failure in two requests (``get``), and whether anything
changed since in one more (``add(count, 0)``). Diagnosis costs O(1) requests per survivor however
many ranks there are (O(W) bytes: ~60 KB at W = 10,000).

The kinds:

- `PRIMARY`: this rank's own failure — it raised an error of its own, or left the session
  without an agreed stop. Only these (and the ranks that never answer) are blamed.
- `SECONDARY`: this rank stopped because another did (its collective failed: "Connection reset
  by peer", gloo's timeout; or its watchdog gave up waiting). Reported as such, never blamed.
- `ALIVE`: this rank's `Responder` answered a diagnosis: the process is alive (blocked in a
  collective, or hung in its step), with the step it is at and how long it has been there.
- `BLAMED`: posted by another rank's watchdog about this rank (its heartbeat stopped, or it
  has been behind at its step for ``stop_grace_secs``): the rank is blamed even if it answers.

A rank that posts no line at all within the diagnosis's window did not answer: it was killed,
or its process is frozen (SIGSTOP), or its host is gone.

The `Responder` is what makes the answer possible without any traffic while training: one
thread per rank blocked in a single ``wait`` for its ``diagnosis/<rank>`` key on a connection of
its own (``store.clone()``; the store's server wakes it when the key appears; a diagnosing rank
sets them all with one ``multi_set``). Zero requests per step; three per diagnosis.

It is also how a blocked rank's watchdog learns whether the rank it watches is alive (`ping`):
liveness on demand, instead of heartbeats posted while steps run. The watchdog sets the watched
rank's key to ``ping <n>``; its responder answers in ``heartbeat/<rank>`` (``"<n> <step> <seconds
at that step>"``, what ``beat()`` returns), deletes the key and waits again. A diagnosis that set
the key meanwhile is not lost: it posts to the roll before it sets the keys, and the responder
looks at the roll's count after the delete (4 requests per ping, on the pinged rank).
"""
from __future__ import annotations

import atexit
import datetime
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["PRIMARY", "SECONDARY", "ALIVE", "BLAMED", "DIAGNOSIS", "HEARTBEAT", "Roll", "supports", "post", "count",
           "read", "wake_all", "ping", "Responder"]

logger = logging.getLogger(__name__)

PRIMARY, SECONDARY, ALIVE, BLAMED = "failed", "secondary", "alive", "blamed"
FAILURES, ANSWERS, COUNT = "roll/failures", "roll/answers", "roll/count"
#: How much of a failure's message the roll keeps.
MESSAGE_CHARS = 500
#: The keys (``diagnosis/<rank>``) a diagnosing rank sets: every rank's `Responder` wakes and answers.
DIAGNOSIS = "diagnosis"
#: Where a rank's liveness is posted (``heartbeat/<rank>``): its answer to a ping, or ``closed``.
HEARTBEAT = "heartbeat"
_PING = "ping "


@dataclass
class Roll:
    """What the roll says, by rank (a rank's first line of each kind)."""

    primary: dict[int, str] = field(default_factory=dict)
    secondary: dict[int, str] = field(default_factory=dict)
    alive: dict[int, str] = field(default_factory=dict)
    blamed: dict[int, str] = field(default_factory=dict)

    def answered(self, rank: int) -> bool:
        return rank in self.primary or rank in self.secondary or rank in self.alive


def supports(store: Any) -> bool:
    """Whether ``store`` has the requests the roll needs (every c10d store does; a minimal
    stand-in with only set/get/check does not, and is diagnosed key by key)."""
    return hasattr(store, "append") and hasattr(store, "add")


def post(store: Any, rank: int, kind: str, message: str) -> None:
    """Appends ``rank``'s line of ``kind`` (3 requests for a failure, 2 otherwise; best effort:
    the store's host may be gone). Every line goes to the compact answers (``<rank>:<kind>,``,
    ~6 bytes a rank); a failure's message also to the failures (a few lines per job)."""
    text = " ".join(str(message).split())[:MESSAGE_CHARS]
    try:
        if kind in (PRIMARY, BLAMED):
            store.append(FAILURES, f"{rank}\t{kind}\t{text}\n")
        store.append(ANSWERS, f"{rank}:{kind[0]},")
        store.add(COUNT, 1)
    except Exception as e:  # noqa: BLE001 - the store's host may be the one that died
        logger.debug("could not post rank %d's %s line to the store: %s", rank, kind, e)


def count(store: Any) -> int:
    """How many lines the roll has (1 request; 0 before the first)."""
    return int(store.add(COUNT, 0))


def read(store: Any) -> Roll:
    """The roll as it stands (2 requests; O(W) bytes: ~6 a rank, plus the failures' messages)."""
    roll = Roll()
    answers = store.get(ANSWERS).decode() if store.check([ANSWERS]) else ""
    kinds = {kind[0]: target for kind, target in ((SECONDARY, roll.secondary), (ALIVE, roll.alive))}
    for token in answers.split(","):
        rank, _, kind = token.partition(":")
        if rank.isdigit() and kind in kinds:
            kinds[kind].setdefault(int(rank), "")
    failures = store.get(FAILURES).decode("utf-8", "replace") if store.check([FAILURES]) else ""
    for line in failures.splitlines():
        parts = line.split("\t", 2)
        if len(parts) == 3 and parts[0].isdigit():
            target = roll.primary if parts[1] == PRIMARY else roll.blamed
            target.setdefault(int(parts[0]), parts[2])
    return roll


def wake_all(store: Any, world_size: int, rank: int) -> None:
    """Wakes every rank's `Responder` (one ``multi_set`` request: O(W) bytes, O(1) requests)."""
    keys = [f"{DIAGNOSIS}/{r}" for r in range(world_size)]
    if hasattr(store, "multi_set"):
        store.multi_set(keys, [str(rank)] * world_size)
    else:
        for key in keys:
            store.set(key, str(rank))


def ping(store: Any, rank: int, number: int) -> None:
    """Asks ``rank``'s `Responder` to post its heartbeat, answering ``number`` (1 request)."""
    store.set(f"{DIAGNOSIS}/{rank}", f"{_PING}{number}")


class Responder:
    """Answers a diagnosis for this rank: a daemon thread blocked in one ``wait`` for its key
    ``diagnosis/<rank>`` on a connection of its own; when a diagnosing rank sets it
    (`wake_all`), posts an `ALIVE` line saying ``status()`` (e.g. the step this rank is at). No
    request until then. A `ping` (a blocked rank's watchdog asking whether this one is alive) is
    answered with ``beat()`` in ``heartbeat/<rank>``, and the thread waits again. `close` wakes
    it to end (also at interpreter exit: a thread blocked in the store's C++ ``wait`` must not
    outlive the interpreter).

    Stores that cannot open a second connection (``clone``) get no responder: their ranks are
    then told apart by silence alone (logged at debug level)."""

    def __init__(self, store: Any, rank: int, status: Callable[[], str]) -> None:
        self.rank = rank
        self._store = store
        self._status = status
        #: ``beat() -> "<step> <seconds at it>"`` (None: no answer) — what a `ping` is answered with.
        self.beat: Callable[[], str | None] | None = None
        self._closing = False
        try:
            self._connection = store.clone()
        except Exception as e:  # noqa: BLE001 - a store of its own kind (HashStore, a wrapper)
            logger.debug("rank %d: no diagnosis responder (the store cannot clone: %s)", rank, e)
            self._connection = None
        self._thread = threading.Thread(target=self._run, name="supervisor-diagnosis-responder", daemon=True)

    @property
    def available(self) -> bool:
        return self._connection is not None

    def start(self) -> None:
        if self._connection is not None:
            atexit.register(self.close)
            self._thread.start()

    def close(self) -> None:
        """Ends the thread (it answers nothing more): sets its own key, joins it (bounded)."""
        if self._closing or not self._thread.is_alive():
            self._closing = True
            return
        self._closing = True
        try:
            self._store.set(f"{DIAGNOSIS}/{self.rank}", "closed")
        except Exception as e:  # noqa: BLE001 - the store's host may be gone (the wait ends then too)
            logger.debug("could not wake rank %d's responder: %s", self.rank, e)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        key = f"{DIAGNOSIS}/{self.rank}"
        while not self._closing:
            try:
                self._connection.wait([key], datetime.timedelta(hours=1))
                if self._closing or not self._answered_ping(key):
                    break
            except Exception as e:  # noqa: BLE001 - an hour passed, or the store's host is gone
                if "timeout" not in str(e).lower() and "timed out" not in str(e).lower():
                    logger.debug("diagnosis responder of rank %d ends: %s", self.rank, e)
                    return
        if not self._closing:
            post(self._connection, self.rank, ALIVE, self._status())

    def _answered_ping(self, key: str) -> bool:
        """Whether the key was a watchdog's `ping` (answered, the key deleted, and no diagnosis
        posted since: wait again); False for a diagnosis (answer it)."""
        value = self._connection.get(key).decode("utf-8", "replace")
        if not value.startswith(_PING):
            return False
        self._connection.delete_key(key)  # before the answer: the next ping comes after it
        answer = self.beat() if self.beat is not None else None
        if answer is not None:
            self._connection.set(f"{HEARTBEAT}/{self.rank}", f"{value[len(_PING):]} {answer}")
        return count(self._connection) == 0  # a diagnosis's keys set before the delete: answer it
