"""Who failed, as the survivors of a failed collective see it (SPEC §12, issue 31): the posts to
the roll (`supervisor.distributed.roll`) and the diagnosis that reads it. failure.py names the
result (`RankFailureError`) and holds the watchdog; this module imports nothing above the roll."""
from __future__ import annotations

import logging
import time
from typing import Any

from supervisor.distributed import roll

__all__ = ["HEARTBEAT_SECS", "CLOSED", "post_failure", "post_secondary", "post_blame", "diagnose",
           "describe_failure", "find_culprits"]

logger = logging.getLogger(__name__)

#: How often a blocked rank's `HangWatchdog` looks (at most ``stop_grace_secs / 10``); without a
#: responder, also the period of its heartbeats' timing.
HEARTBEAT_SECS = 1.0
#: The heartbeat of a rank whose agreement closed normally.
CLOSED = "closed"


def post_failure(store: Any, rank: int, message: str) -> None:
    """Tells the other ranks this rank is leaving because of ``message``: its own failure, the
    one they blame (best effort)."""
    if roll.supports(store):
        roll.post(store, rank, roll.PRIMARY, message)
        return
    try:
        store.set(f"failed/{rank}", message[:2000])
    except Exception as e:  # noqa: BLE001 - the store's host may be the one that died
        logger.debug("could not post rank %d's failure to the store: %s", rank, e)


def post_blame(store: Any, rank: int, message: str) -> None:
    """Blames ``rank`` (posted by another rank's watchdog: its heartbeat stopped, or it hung)."""
    if roll.supports(store):
        roll.post(store, rank, roll.BLAMED, message)


def post_secondary(store: Any, rank: int, message: str) -> None:
    """Tells the other ranks this rank stops because another failed (never blamed)."""
    if roll.supports(store):
        roll.post(store, rank, roll.SECONDARY, message)
    else:
        try:
            store.set(f"alive/{rank}", "1")
        except Exception as e:  # noqa: BLE001
            logger.debug("could not post rank %d's secondary failure to the store: %s", rank, e)


def diagnose(store: Any, rank: int, world_size: int, *, grace_secs: float,
             beating: set[int] | None = None, heartbeat_secs: float = HEARTBEAT_SECS,
             settle_secs: float | None = None, secondary: dict[int, str] | None = None,
             note: str = "diagnosing a failed collective") -> tuple[dict[int, str], list[int]]:
    """Returns ``({rank: its posted error}, [unresponsive ranks])`` as seen within ``grace_secs``.
    ``beating``, when given, receives the unresponsive ranks known to be alive (hung or blocked,
    not killed); ``secondary`` the ranks that stopped because of another's failure.

    This rank posts itself as secondary, then sets the roll's `DIAGNOSIS` key: every live rank's
    `roll.Responder` answers. With ``settle_secs``, the wait ends once every other rank has a line
    in the roll, or none came for ``settle_secs``; the ranks that never answered are the killed or
    frozen ones. Without it (no responders), a silent rank is dead once its `HangWatchdog`
    heartbeat has not changed for two ``heartbeat_secs`` since this call first read it; the wait
    ends when every silent rank is dead, or at ``grace_secs``. A rank named by another's
    watchdog (`roll.BLAMED`) counts as unresponsive, even if it answers."""
    if not roll.supports(store):
        return _diagnose_by_keys(store, rank, world_size, grace_secs, beating, heartbeat_secs)
    post_secondary(store, rank, note)
    try:
        roll.wake_all(store, world_size, rank)
        view = _await_answers(store, rank, world_size, grace_secs, heartbeat_secs, settle_secs, beating)
    except Exception as e:  # noqa: BLE001
        logger.warning("the process group's store is unreachable (%s); its host (rank 0 or the "
                       "torchrun agent) may be gone", e)
        return {}, [0] if rank != 0 else []
    if secondary is not None:
        secondary.update((r, m) for r, m in view.secondary.items() if r != rank and r not in view.primary)
    failed = {r: m for r, m in view.primary.items() if r != rank}
    silent = [r for r in range(world_size)
              if r != rank and r not in failed and (r in view.blamed or r not in view.secondary)]
    if beating is not None:
        beating.update(r for r in silent if r in view.alive and r not in view.blamed)
    return failed, silent


def _await_answers(store: Any, rank: int, world_size: int, grace_secs: float, heartbeat_secs: float,
                   settle_secs: float | None, beating: set[int] | None) -> roll.Roll:
    """Polls the roll's count (1 request each 50 ms), reading the roll (2 requests) when the count
    changed — at most once a second, and once more before returning — until the ranks have
    answered (see `diagnose`) or ``grace_secs`` have passed: O(1) requests in all, whatever W."""
    start = last_change = time.monotonic()
    last_read, read_count, lines, view = start, roll.count(store), -1, roll.Roll()
    view = roll.read(store)
    beats: dict[int, tuple[bytes | None, float]] = {}
    changed: set[int] = set()
    while True:
        time.sleep(0.05)
        now = time.monotonic()
        current = roll.count(store)
        if current != lines:
            lines, last_change = current, now
        if lines != read_count and (now - last_read >= 1.0 or lines >= world_size):
            view, read_count, last_read = roll.read(store), lines, now
        silent = [r for r in range(world_size) if r != rank and not view.answered(r)]
        done = now - start >= grace_secs
        if settle_secs is not None:
            done = done or now - last_change >= settle_secs or not silent
        elif all(_stopped_beating(store, r, beats, changed, now, 2 * heartbeat_secs) for r in silent):
            done = True
        if done:
            view = roll.read(store) if lines != read_count else view
            view.alive.update((r, "heartbeat goes on") for r in changed)
            return view


def _diagnose_by_keys(store: Any, rank: int, world_size: int, grace_secs: float, beating: set[int] | None,
                      heartbeat_secs: float) -> tuple[dict[int, str], list[int]]:
    """`diagnose` on a store without ``append``/``add``: every rank's ``failed/<rank>`` and
    ``alive/<rank>`` keys, read one by one (O(W) requests a poll)."""
    post_secondary(store, rank, "")
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
        if other in beats and value != CLOSED.encode():
            changed.add(other)
        beats[other] = (value, now)
        return False
    return value is not None and value != CLOSED.encode() and other not in changed and now - since >= still_secs


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


def find_culprits(store: Any, rank: int, world_size: int, *, grace_secs: float, settle_secs: float | None,
                  note: str) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """``(ranks to blame, secondary ranks, a sentence)`` for a survivor whose collective failed
    (``note``: its error, posted as secondary). The ranks blamed are those that raised, were
    blamed by a watchdog, or never answered; only when there are none, the ones alive but stuck
    (hung). The others that stopped are secondary, never blamed (issue 31.3)."""
    beating: set[int] = set()
    secondary: dict[int, str] = {}
    failed, silent = diagnose(store, rank, world_size, grace_secs=grace_secs, beating=beating,
                              settle_secs=settle_secs, secondary=secondary, note=note)
    gone = [r for r in silent if r not in beating]
    stuck = [r for r in silent if r in beating]
    blamed = gone if failed or gone else stuck
    others = sorted(set(secondary) | (set(stuck) - set(blamed)))
    text = describe_failure(failed, blamed, grace_secs, beating)
    if others:
        text += f" (rank {', '.join(map(str, others))} stopped because of it: secondary)"
    return tuple(sorted(failed)) + tuple(blamed), tuple(others), text
