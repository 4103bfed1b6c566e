"""What the subcommands share: exit codes, the logdir scan, the writer-lock check, formatting."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

from supervisor.checkpoint import (
    MANIFEST_FILE,
    OWNER_FILE,
    CheckpointState,
    OwnershipLock,
    list_committed,
    read_index,
    step_of,
    transient_base,
    verify_checkpoint,
)
from supervisor.checkpoint.ownership.lock import read_owner_record
from supervisor.checkpoint.layout.retention import RetentionRule, RetentionState, kept_reasons, rule_of
from supervisor.cli._paths import NAME_WITH_STEP
from supervisor.errors import CheckpointError, LogdirInUseError

__all__ = ["EXIT_OK", "EXIT_PROBLEM", "EXIT_USAGE", "CheckpointRow", "Listing", "scan_logdir", "check_one", "annotate_retention",
           "writer_lock", "writer_note", "Refused", "format_bytes", "format_age", "table", "print_json", "error",
           "index_membership", "help_text", "summary", "EXIT_BROKEN_PIPE", "output_cut_short", "basename_from_index",
           "step_in", "DEFAULT_BASENAME"]

EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + getattr(signal, "SIGPIPE", 13)  # what a shell reports for a tool cut short by `| head`
DEFAULT_BASENAME = "model.ckpt"


@dataclass
class CheckpointRow:
    """One checkpoint as the CLI reports it (also its ``--json`` object)."""

    step: int | None
    path: str
    name: str
    verified: bool
    reason: str | None
    indexed: bool        # the checkpoint the index's model_checkpoint_path names
    in_index: bool       # listed in all_model_checkpoint_paths (managed by retention)
    wall_time: float | None
    bytes: int
    metric: float | None = None  # the metric keep_best ranks it by, as the index records it (ls)
    kept: list[str] = field(default_factory=list)  # why retention keeps it: newest, best, period, hours (ls)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Listing:
    """A scanned log directory: its index (or why it is unusable) and every checkpoint, by step."""

    logdir: str
    basename: str
    index: CheckpointState | None
    index_problem: str | None
    rows: list[CheckpointRow]

    @property
    def problems(self) -> bool:
        return self.index_problem is not None or any(not r.verified for r in self.rows)


def annotate_retention(index: CheckpointState | None, rows: list[CheckpointRow]) -> None:
    """Sets each row's ``metric`` and ``kept`` from the logdir's index (`retention.kept_reasons`
    on the rule the index records; without one, TF's: every listed checkpoint is among the newest)."""
    if index is None:
        return
    names = tuple(os.path.basename(p.rstrip("/")) for p in index.all_model_checkpoint_paths)
    metrics = index.all_model_checkpoint_metrics if len(index.all_model_checkpoint_metrics) == len(names) else ()
    state = RetentionState(tuple((n, 0.0) for n in names), 0.0,
                           {n: m for n, m in zip(names, metrics) if math.isfinite(m)})
    reasons = kept_reasons(state, rule_of(index) or RetentionRule(max_to_keep=None))
    preserved = index.last_preserved_timestamp
    for row in rows:
        row.metric = state.metrics.get(row.name)
        row.kept = list(reasons.get(row.name, ()))
        if row.name not in reasons and row.verified and preserved is not None and row.wall_time is not None \
                and row.wall_time <= preserved:
            row.kept = ["hours"]


def scan_logdir(logdir: str, *, basename: str | None = None, verify: str = "full") -> Listing:
    """Lists the committed checkpoints of ``logdir`` and those its index names, each verified."""
    index, problem = None, None
    try:
        index = read_index(logdir)
    except (ValueError, OSError) as e:
        problem = str(e)
    basename = basename or basename_from_index(index) or DEFAULT_BASENAME
    paths: dict[str, None] = {}
    for _, name in list_committed(logdir, basename):
        paths[os.path.abspath(os.path.join(logdir, name))] = None
    listed: set[str] = set()
    stamps: dict[str, float] = {}
    indexed_path = None
    if index is not None:
        absolute = lambda p: os.path.abspath(p if os.path.isabs(p) else os.path.join(logdir, p))  # noqa: E731
        for i, p in enumerate(index.all_model_checkpoint_paths):
            listed.add(absolute(p))
            paths.setdefault(absolute(p), None)
            if i < len(index.all_model_checkpoint_timestamps):
                stamps[absolute(p)] = index.all_model_checkpoint_timestamps[i]
        indexed_path = absolute(index.model_checkpoint_path)
        paths.setdefault(indexed_path, None)
    rows = [check_one(p, basename=basename, verify=verify, indexed=p == indexed_path, in_index=p in listed,
                      index_time=stamps.get(p)) for p in paths]
    rows = _without_retired(logdir, rows, index)
    rows.sort(key=lambda r: (r.step is None, r.step if r.step is not None else 0, r.name))
    if index is not None and indexed_path is not None and not os.path.isdir(indexed_path):
        problem = f"the index names {index.model_checkpoint_path}, which does not exist"
    return Listing(logdir, basename, index, problem, rows)


def _without_retired(logdir: str, rows: list[CheckpointRow], index: CheckpointState | None) -> list[CheckpointRow]:
    """Drops checkpoints a live writer retired while we looked: gone from disk, and either no
    longer named by the index as it is now, or present under a transient ``.deleting-``/``.tmp-``
    name (retention or a re-save is replacing it; the index is rewritten next)."""
    if index is None or all(os.path.isdir(r.path) for r in rows):
        return rows
    # The directory first, the index second: retention moves a checkpoint aside, then rewrites
    # the index, then deletes; so an index read after the listing that still names a missing
    # checkpoint was read before the rewrite, and the listing still shows it moved aside.
    try:
        in_flight = {transient_base(n) for n in os.listdir(logdir)} - {None}
        now = read_index(logdir)
    except (ValueError, OSError):
        return rows
    named = set() if now is None else {
        os.path.abspath(p if os.path.isabs(p) else os.path.join(logdir, p))
        for p in (now.model_checkpoint_path, *now.all_model_checkpoint_paths)}
    return [r for r in rows if os.path.isdir(r.path) or (r.path in named and r.name not in in_flight)]


def check_one(path: str, *, basename: str | None = None, verify: str = "full", indexed: bool = False,
              in_index: bool = False, index_time: float | None = None) -> CheckpointRow:
    """Verifies one checkpoint directory and describes it (a missing one is not verified)."""
    path = os.path.abspath(path)
    name = os.path.basename(path)
    step = step_in(name, basename)
    if not os.path.isdir(path):
        where = "listed in the index but " if in_index or indexed else ""
        return CheckpointRow(step, path, name, False, f"{where}does not exist", indexed, in_index, index_time, 0)
    verified, reason = True, None
    try:
        manifest = verify_checkpoint(path, verify)
        step = manifest.step if step is None else step
        wall_time: float | None = manifest.wall_time
    except CheckpointError as e:
        verified, reason = False, _strip_path(str(e), path)
        wall_time = index_time if index_time is not None else _mtime(path)
    return CheckpointRow(step, path, name, verified, reason, indexed, in_index, wall_time, _tree_bytes(path))


def index_membership(path: str) -> tuple[bool, bool, float | None, str | None]:
    """Where the index of ``path``'s parent (its log directory) has checkpoint ``path``:
    ``(indexed, in_index, index_time, basename)`` — named by ``model_checkpoint_path``, listed
    in ``all_model_checkpoint_paths``, the time the index records for it, and the checkpoint
    basename the index uses (all False/None without a readable index)."""
    path = os.path.abspath(path)
    logdir = os.path.dirname(path)
    try:
        index = read_index(logdir)
    except (ValueError, OSError):
        index = None
    if index is None:
        return False, False, None, None
    absolute = lambda p: os.path.abspath(p if os.path.isabs(p) else os.path.join(logdir, p))  # noqa: E731
    listed = [absolute(p) for p in index.all_model_checkpoint_paths]
    stamps = index.all_model_checkpoint_timestamps
    where = listed.index(path) if path in listed else None
    stamp = stamps[where] if where is not None and where < len(stamps) else None
    return absolute(index.model_checkpoint_path) == path, where is not None, stamp, basename_from_index(index)


def basename_from_index(index: CheckpointState | None) -> str | None:
    """The run's checkpoint basename, from the index's ``model_checkpoint_path`` (None without)."""
    if index is None:
        return None
    match = NAME_WITH_STEP.match(os.path.basename(os.path.normpath(index.model_checkpoint_path)))
    return match.group("base") if match else None


def step_in(name: str, basename: str | None) -> int | None:
    """The step of the checkpoint named ``name`` (``<basename>-<step>``; any ``<name>-<step>``)."""
    if basename is not None and (step := step_of(name, basename)) is not None:
        return step
    match = NAME_WITH_STEP.match(name)
    return int(match.group("step")) if match else None


def _strip_path(text: str, path: str) -> str:
    return text[len(path) + 2:] if text.startswith(path + ": ") else text


def _mtime(path: str) -> float | None:
    try:
        return os.path.getmtime(os.path.join(path, MANIFEST_FILE)) if os.path.exists(
            os.path.join(path, MANIFEST_FILE)) else os.path.getmtime(path)
    except OSError:
        return None


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


# ---------------------------------------------------------------- the writer's lock
def writer_note(logdir: str) -> str | None:
    """Who the lock's owner record says is writing (readers never take the lock to ask), or
    None when there is no record or its process is gone (a record a SIGKILL left behind)."""
    try:  # untrusted, and a FIFO in its place is refused, never waited on
        owner = read_owner_record(os.path.join(logdir, OWNER_FILE))
    except (OSError, ValueError):
        return None
    pid, host = owner["pid"], owner["host"]
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return f"a writer is active: pid {pid} on host {host}"



class Refused(Exception):
    """A mutating command refused to run (a writer holds the lock); exit code 1."""


@contextlib.contextmanager
def writer_lock(logdir: str) -> Iterator[None]:
    """Holds ``logdir``'s ownership lock for a mutation, as a writer would.

    Taking it non-blocking is the test "does a writer hold it?" that cannot steal it: the OS
    grants it only when no live process holds it (a SIGKILLed writer's lock is free again).

    Raises:
        Refused: a writer holds the lock (the message names its pid and host).
    """
    def acquire() -> OwnershipLock:
        lock = OwnershipLock(logdir)
        lock.acquire()
        return lock

    with holding(acquire):
        yield


@contextlib.contextmanager
def holding(acquire: Callable[[], Any]) -> Iterator[None]:
    """Holds the lock ``acquire()`` takes and returns (released after); `Refused` naming the
    holder when it raises `LogdirInUseError` (a writer holds it)."""
    try:
        lock = acquire()
    except LogdirInUseError as e:
        raise Refused(f"refusing: {e}") from None
    try:
        yield
    finally:
        lock.release()


# ---------------------------------------------------------------- output
def format_bytes(n: int) -> str:
    """``512 B``, ``3.0 KiB``, ``12.5 MiB``, ``1.00 GiB``."""
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if n < scale << 10:
            return f"{n / scale:.1f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def format_age(wall_time: float | None, now: float | None = None) -> str:
    """``just now``, ``42 s ago``, ``5 min ago``, ``3 h ago``, ``2 days ago`` (or ``in 3 s``)."""
    if wall_time is None:
        return "?"
    delta = (time.time() if now is None else now) - wall_time
    future, delta = delta < 0, abs(delta)
    if delta < 2:
        return "just now"
    for limit, scale, unit in ((120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if delta < limit:
            text = f"{int(delta // scale)} {unit}"
            break
    else:
        text = f"{int(delta // 86400)} days"
    return f"in {text}" if future else f"{text} ago"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Aligned columns (``right``: indices of right-aligned columns); the last column is not padded."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        cells[-1] = str(row[-1]).rjust(widths[-1]) if len(row) - 1 in right else str(row[-1])
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")


def help_text(doc: str) -> str:
    """A docstring paragraph as ``--help`` shows it: without reST markup (````LOGDIR```` and
    ```SidecarEvaluator``` read ``LOGDIR`` and ``SidecarEvaluator``)."""
    return re.sub(r"``([^`]+)``|`([^`]+)`", lambda m: m.group(1) or m.group(2), doc)


def summary(doc: str) -> str:
    """A subcommand's ``--help`` description: its module docstring's first paragraph, after the
    usage that opens it (``verify PATH``: ...)."""
    return help_text(doc.split("\n\n")[0].split(": ", 1)[1])


def output_cut_short() -> int:
    """The reader of stdout went away (``| head``): returns `EXIT_BROKEN_PIPE` to end quietly,
    as Unix tools do. stdout is pointed at the null device first, so that flushing what is
    still buffered at exit raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout has no file descriptor (replaced): nothing to redirect
        pass
    return EXIT_BROKEN_PIPE


def error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
