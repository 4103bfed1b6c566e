"""``lock="lease"``: single-writer ownership of a logdir on any `Storage` (SPEC §16).

On object stores there is no ``flock``, and on shared filesystems ``flock`` may be node-local
(Lustre ``localflock``, some NFS setups), so two nodes could both believe they own a logdir. A
lease needs nothing but the one primitive every backend provides atomically — create a whole
object only if the name is free (`Storage.create_exclusive`: ``If-None-Match: *`` on S3,
``link``/``O_EXCL`` on POSIX, NFSv3+ and Lustre):

* The lease is a series of generations ``<logdir>/.supervisor.lease/<generation:016d>.json``,
  each naming its holder (host, pid, boot id, PID namespace and process start time, a random
  owner id) and when it expires. The newest generation is the lease.
* **Acquire**: read the newest; if it is live and someone else's → `LogdirInUseError` naming
  the holder, when the lease expires and how to take it over. If there is none, or it expired,
  or its holder released it, or its holder is certainly gone (on this host, same boot: its
  process no longer runs — `holder.gone_reason`; a WARNING says so) → create generation
  ``n + 1``. Two writers racing for an expired lease both try to create the same ``n + 1``:
  exactly one succeeds; the other is refused and names the winner.
* **Renew** every ``lease_secs / 3`` on a thread: create generation ``n + 1`` — a conditional
  write on the version held, so a holder that was overtaken (its lease expired and another
  writer took it over) finds ``n + 1`` taken and marks itself **lost**. So does a holder whose
  renewal fails (the storage's bounded retries exhausted) or comes too late: it starts, or goes
  through, after the record it renews expired (a store that came back after an outage longer
  than the lease never revives it).
  Generations older than ``n - 1`` are deleted; the newest is never deleted, so numbers never
  repeat (a holder that was paused cannot slip back in under a recycled number — and after
  creating a generation, a renewer lists the directory to check nothing newer exists).
* `check()` raises `LeaseLostError` once the lease is lost, or when less than
  ``lease_secs / 3`` of it is left unrenewed (a stalled process, or a renewal stuck on the
  network: it waits for one in flight at most until the lease expires, then fails naming it):
  the writer calls it before every commit and stops — never two writers committing.
* **Release** writes a final generation marked released, so the next writer need not wait for
  the expiry.

Limits (documented for users): expiry compares wall clocks of different hosts — they must
agree to well within ``lease_secs / 3`` (NTP does); the holder stops committing when less than
``lease_secs / 3`` is left, which is the margin. The lease is as atomic as the storage's
exclusive create: S3 (and S3-compatible stores with conditional writes), local disks, NFSv3+
and Lustre give it; an NFSv2 or a FUSE mount without hard links falls back to ``O_EXCL``
(atomic on a single server only).
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from dataclasses import asdict
from typing import Any

from supervisor.checkpoint.ownership.holder import identity
from supervisor.checkpoint.ownership.lease_record import LeaseLostError, LeaseRecord, in_use_message, when as _when
from supervisor.checkpoint.storage.base import ObjectExistsError, Storage
from supervisor.clock import Clock, resolve_clock
from supervisor.errors import LogdirInUseError

__all__ = ["Lease", "LeaseLostError", "LeaseRecord", "LEASE_DIR", "DEFAULT_LEASE_SECS"]

logger = logging.getLogger(__name__)

LEASE_DIR = ".supervisor.lease"
DEFAULT_LEASE_SECS = 60.0
_GENERATION = re.compile(r"^(\d{16})\.json$")
_RECORD_MAX_BYTES = 1 << 16


class Lease:
    """The single-writer lease of ``directory`` on ``storage`` (see the module docstring).

    Args:
        storage: where the logdir lives.
        directory: the logdir (path or URL, in the storage's spelling).
        lease_secs: how long a lease lives unrenewed; renewed every third of it.
        clock: injectable clock (``time`` for expiries, ``wait`` for the renewal thread).

    Example::

        lease = Lease(storage_for(logdir), logdir, lease_secs=60)
        lease.acquire()     # LogdirInUseError naming the holder while its lease is live
        ...
        lease.check()       # before each commit: LeaseLostError once lost
        lease.release()
    """

    def __init__(self, storage: Storage, directory: str, *, lease_secs: float = DEFAULT_LEASE_SECS,
                 clock: Clock | None = None) -> None:
        if not isinstance(lease_secs, (int, float)) or isinstance(lease_secs, bool) or not lease_secs > 0:
            raise ValueError(f"lease_secs must be a positive number of seconds, got {lease_secs!r}")
        self.storage = storage
        self.directory = directory
        self.path = storage.join(directory, LEASE_DIR)
        self.lease_secs = float(lease_secs)
        self.owner_id = uuid.uuid4().hex
        self._clock = resolve_clock(clock)
        self._record: LeaseRecord | None = None
        self._lost: str | None = None
        self._renewing: tuple[int, float] | None = None  # (generation, started at) of a renewal in flight
        self._renewed = threading.Event()  # cleared while a renewal is in flight
        self._lock = threading.Lock()  # the fields above; never held across a storage request
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ state
    @property
    def held(self) -> bool:
        return self._record is not None and self._lost is None

    @property
    def lost(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._lost

    @property
    def generation(self) -> int | None:
        """The generation this writer holds (None when it holds none). Successive holders' only
        grow: what fences their late writes (supervisor.checkpoint.layout.fencing)."""
        record = self._record
        return None if record is None else record.generation

    @property
    def expires_at(self) -> float | None:
        return None if self._record is None else self._record.expires_at

    def check(self) -> None:
        """Raises `LeaseLostError` unless this writer still safely holds the lease: not marked
        lost, more than a third of it left (`_in_time`), and no newer generation on the storage
        (one listing: a writer that took it over — e.g. from a host whose clock runs ahead — is
        seen at once). A listing that fails leaves the expiry as the guarantee (WARNING)."""
        if self._record is None:
            raise LeaseLostError(f"the lease of {self.directory} is not held by this writer")
        left = self._in_time()
        if left is not None:
            self._check_newest(left)
            self._in_time()  # the listing took time: the expiry again
        if self._lost is not None:
            raise LeaseLostError(f"this writer lost the lease of {self.directory}: {self._lost}; "
                                 f"{self._successor()}; it must not commit")

    def _in_time(self) -> float | None:
        """Seconds left on the lease, from this writer's record alone; None once it is lost
        (marked here when less than a third is left and no renewal is in flight, or one is
        but the lease expired meanwhile: a renewal is waited for at most until then)."""
        while True:
            with self._lock:
                if self._lost is not None or self._record is None:
                    return None
                now, renewing = self._clock.time(), self._renewing
                left = self._record.expires_at - now
                if left >= self.lease_secs / 3:
                    return left
                if renewing is None or left <= 0:
                    waiting = f"; its renewal has waited {now - renewing[1]:.1f} s on the storage" if renewing else ""
                    self._mark_lost(f"it was not renewed in time ({max(left, 0.0):.1f} s of {self.lease_secs:g} s "
                                    f"left{waiting})")
                    return None
            self._clock.wait(self._renewed, left)

    def _check_newest(self, left: float) -> None:
        try:
            generations = self._generations()
            with self._lock:
                known = self._record.generation if self._record is not None else 0
                renewing = self._renewing[0] if self._renewing is not None else None
            newer = [g for g in generations if g > known]
            if newer == [renewing] and getattr(self.newest(), "owner_id", None) == self.owner_id:
                newer = []  # created by the renewal in flight, not recorded yet
        except OSError as e:
            logger.warning("could not list the lease of %s before a commit (%s); relying on its expiry "
                           "(%.1f s left)", self.directory, e, left)
            return
        if newer:
            with self._lock:
                self._mark_lost("another writer took it over")

    def _successor(self) -> str:
        """Who holds the lease now, as far as the storage says (for `check`'s message)."""
        try:
            newest = self.newest()
        except OSError as e:
            return f"the current holder cannot be read ({e})"
        if newest is None or newest.owner_id == self.owner_id:
            return "no other writer holds it yet, but one may take it over at any moment"
        if newest.released:
            return f"its next holder ({newest.describe()}) has released it"
        return f"it is now held by {newest.describe()} until {_when(newest.expires_at)}"

    def live_holder(self) -> LeaseRecord | None:
        """The record of the lease while some writer holds it live (not released, not expired),
        else None; `in_use_error` turns it into the refusal a second writer gets."""
        current = self.newest()
        if current is None or current.released or self._clock.time() >= current.expires_at or current.gone():
            return None
        return current

    def in_use_error(self, holder: LeaseRecord) -> LogdirInUseError:
        """The refusal naming ``holder`` and when its lease expires."""
        return LogdirInUseError(self._in_use_message(holder, self._clock.time()))

    # ------------------------------------------------------------ reading
    def newest(self) -> LeaseRecord | None:
        """The current lease record (the newest generation), or None when there is none.
        An unreadable newest generation is reported as held by an unknown writer until its
        object's age exceeds ``lease_secs``."""
        for _ in range(5):
            generations = self._generations()
            if not generations:
                return None
            path = self._generation_path(generations[-1])
            try:
                return LeaseRecord.from_bytes(self.storage.read_bytes(path, max_bytes=_RECORD_MAX_BYTES))
            except FileNotFoundError:
                continue  # released and cleaned up while being read: list again
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.warning("the lease record %s is unreadable (%s)", path, e)
                mtime = self._safe_mtime(path)
                return LeaseRecord(generation=generations[-1], owner_id="?", host="unknown", pid=-1,
                                   acquired_at=mtime, expires_at=mtime + self.lease_secs, lease_secs=self.lease_secs)
        raise OSError(f"the lease records under {self.path} kept vanishing while being read")

    def _safe_mtime(self, path: str) -> float:
        try:
            return self.storage.stat(path).mtime or self._clock.time()
        except OSError:
            return self._clock.time()

    def _generations(self) -> list[int]:
        try:
            names = self.storage.listdir(self.path)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_GENERATION.match, names) if m)

    def _generation_path(self, generation: int) -> str:
        return self.storage.join(self.path, f"{generation:016d}.json")

    # ------------------------------------------------------------ acquire / renew / release
    def acquire(self, *, renew: bool = True) -> None:
        """Takes the lease or raises `LogdirInUseError` naming the holder and its expiry;
        ``renew=False`` starts no renewal thread (call `renew` yourself)."""
        if self.held:
            return
        self.storage.makedirs(self.path)
        for _ in range(3):
            current = self.newest()
            now = self._clock.time()
            live = current is not None and not current.released and now < current.expires_at
            gone = current.gone() if live else None
            if live and gone is None:
                raise LogdirInUseError(self._in_use_message(current, now))
            if gone is not None:
                logger.warning("taking over the lease of %s from %s at once: %s (its lease would expire at %s)",
                               self.directory, current.describe(), gone, _when(current.expires_at))
            elif current is not None and not current.released:
                logger.warning("taking over the lease of %s from %s, which expired at %s", self.directory,
                               current.describe(), _when(current.expires_at))
            generation = (current.generation if current is not None else 0) + 1
            if self._create(generation, now, acquired_at=now):
                break
        else:
            raise LogdirInUseError(f"the logdir {self.directory} is contended: other writers kept taking its "
                                   f"lease ({self.path}) while this one tried")
        self._lost = None
        self._cleanup()
        if renew:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="supervisor-lease", daemon=True)
            self._thread.start()

    def _create(self, generation: int, now: float, *, acquired_at: float, released: bool = False) -> bool:
        record = LeaseRecord(generation=generation, owner_id=self.owner_id, host=socket.gethostname(),
                             pid=os.getpid(), acquired_at=acquired_at, expires_at=now + self.lease_secs,
                             lease_secs=self.lease_secs, released=released, **identity())
        try:
            self.storage.create_exclusive(self._generation_path(generation), record.to_bytes())
        except ObjectExistsError:
            return False
        newer = [g for g in self._generations() if g > generation]
        if newer:  # a number recycled under a paused writer: never ours
            return False
        with self._lock:
            self._record = record
        return True

    def renew(self) -> bool:
        """Renews now (the thread calls this every ``lease_secs / 3``); False once lost."""
        with self._lock:
            held = self._record
            if held is None or self._lost is not None:
                return False
            now = self._clock.time()
            if now >= held.expires_at:
                self._mark_lost(f"its renewal came too late (it expired at {_when(held.expires_at)})")
                return False
            self._renewing = (held.generation + 1, now)
            self._renewed.clear()
        try:
            renewed = self._create(held.generation + 1, now, acquired_at=held.acquired_at)
            winner = None if renewed else self.newest()
        except OSError as e:
            renewed, winner = False, e
        with self._lock:
            self._renewing = None
            self._renewed.set()
            landed = self._clock.time()
            if renewed and landed >= held.expires_at:  # no check ran while it waited: still too late
                self._mark_lost(f"its renewal came too late (it went through at {_when(landed)}, after the "
                                f"lease expired at {_when(held.expires_at)})")
            elif not renewed:
                self._mark_lost(f"renewing it failed ({winner})" if isinstance(winner, OSError) else
                                "another writer took it over" + (f" ({winner.describe()})" if winner else ""))
            if self._lost is not None:  # also when `check` found it overdue meanwhile: lost for good
                return False
        self._cleanup()
        return True

    def _run(self) -> None:
        """Renews once a third of the record's lease has passed (two thirds left at each start)."""
        while not self._clock.wait(self._stop, max(0.0, (self.expires_at or 0.0) - 2 * self.lease_secs / 3
                                                       - self._clock.time())):
            if not self.renew():
                return

    def release(self) -> None:
        """Stops renewing and marks the lease released (the next writer need not wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            held, self._record = self._record, None
            if held is None or self._lost is not None:
                return
        try:
            now = self._clock.time()
            released = LeaseRecord(**{**asdict(held), "generation": held.generation + 1, "expires_at": now,
                                      "released": True})
            self.storage.create_exclusive(self._generation_path(released.generation), released.to_bytes())
        except OSError as e:  # ObjectExistsError included: someone took it over meanwhile
            logger.warning("could not mark the lease of %s released (%s); it expires at %s", self.directory,
                           e, _when(held.expires_at))
            return
        self._cleanup(keep_from=released.generation - 1)

    # ------------------------------------------------------------ helpers
    def _mark_lost(self, why: str) -> None:
        if self._lost is None:
            self._lost = why
            logger.error("the lease of %s is lost: %s; this writer stops before its next commit", self.directory, why)

    def _cleanup(self, keep_from: int | None = None) -> None:
        """Deletes generations older than the previous one (never the newest)."""
        if keep_from is None:
            keep_from = (self._record.generation if self._record else 0) - 1
        try:
            generations = self._generations()
        except OSError as e:
            logger.debug("could not list the old lease generations of %s: %s", self.directory, e)
            return
        for generation in generations:
            if generation >= keep_from:
                break
            try:
                self.storage.remove(self._generation_path(generation))
            except OSError as e:
                logger.debug("could not delete the old lease generation %s: %s", generation, e)

    def _in_use_message(self, holder: LeaseRecord, now: float) -> str:
        return in_use_message(self.directory, self.path, holder, now)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

