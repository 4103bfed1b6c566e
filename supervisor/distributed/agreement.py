"""`CollectiveAgreement`: every rank saves and stops at the same step (SPEC §3.5, §12).

Each rank's requests of step N (a save: a time-based checkpoint, a listener, ``request_save``;
a stop: ``StopAtSecsHook``, SIGTERM, a NaN, early stopping, ``request_stop``) go into one small
asynchronous ``all_reduce`` (MAX over the fixed-size summary of `supervisor.agreement`: five
integers whatever the world size, combined by its pure `combine_summary`) started at the
boundary of step N on a gloo group of its own. The next step runs while it travels; at the
boundary of N+1 its result is applied on every rank. So:

- any rank asks → every rank acts, at the same step (N+1 for a request made during step N);
- a stop caused by SIGTERM/SIGINT on any rank is a preemption on every rank
  (``Decision.preempted``: every session's ``preempted`` is True, no finished mark is written);
- a stop every rank requests at the same step (``Requests.stop_on_every_rank``: the target of
  ``StopAtStepHook(last_step)``, known to all ranks ahead) applies at once, at that step;
- the collective overlaps the step: on the critical path there is only ``wait()`` on a work
  that has usually completed (always called: only it raises the error of a failed one).

The side group is always gloo (also when training uses NCCL), with ``timeout =
stop_grace_secs``: a rank that dies, raises or hangs makes the others' wait fail within that
time, and `RankFailureError` names it (failure.py, diagnosis.py). It is made once and reused by
later agreements of the same timeout (`side_group`). The collective is also the liveness check:
no store request is made while steps complete (issue 31.1; docs/distributed.md). Every rank must
call `decide` once per step (the session does) and create the agreement at the same point
(session creation).

Example::

    agreement = CollectiveAgreement(stop_grace_secs=60)   # after init_process_group
    decision = agreement.decide(step, Requests(stop_reason="SIGTERM"))
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

import torch

from supervisor.distributed import env
from supervisor._validate import check_number
from supervisor.agreement import (
    NO_REQUESTS,
    SUMMARY_SIZE,
    Agreement,
    Decision,
    Requests,
    combine,
    combine_summary,
    flag_count,
    merge,
    summary_of_flags,
    write_flags,
    write_summary,
)
from supervisor.distributed import channel as channel_module
from supervisor.distributed import roll
from supervisor.distributed import rng as rng_module
from supervisor.distributed.diagnosis import find_culprits
from supervisor.distributed.failure import HangWatchdog, RankFailureError, is_collective_failure, post_failure

__all__ = ["CollectiveAgreement", "side_group", "forget_side_group"]

logger = logging.getLogger(__name__)

_NO_REASONS: tuple[tuple[str, ...], str | None] = ((), None)


class CollectiveAgreement(Agreement):
    """Combines save and stop requests across the ranks of the default process group.

    Args:
        stop_grace_secs: how long a rank waits for the others' part of a step's agreement
            before it declares them failed (the side group's collective timeout; a part of it,
            at most 5 s, goes to finding out which rank failed).
        gather_rng: gather every rank's RNG state to the chief at each agreed save, so the
            checkpoint holds them all (supervisor.distributed.rng).
        capture_rng: ``capture_rng() -> state``: this rank's RNG state as a checkpoint stores it
            (the session passes one that includes its data loaders' generators).
        modules: the training state's objects; when one is a ``DistributedDataParallel`` model
            (without a communication hook of its own) the flags ride in its gradient all-reduce
            (supervisor.distributed.channel) and steps that run it need no collective of their own.
    """

    local = False

    def __init__(self, *, stop_grace_secs: float = 120.0, gather_rng: bool = True,
                 capture_rng: Any = None, modules: Any = ()) -> None:
        import torch.distributed as dist

        if not env.is_initialized():
            raise RuntimeError("CollectiveAgreement needs an initialised torch.distributed process "
                               "group; call supervisor.distributed.init_process_group() first")
        self.stop_grace_secs = check_number("stop_grace_secs", stop_grace_secs, strictly_positive=True)
        self._diagnose_secs = min(5.0, self.stop_grace_secs / 4)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._gather_rng = bool(gather_rng)
        self._capture_rng = capture_rng
        # The side group is made at the first decide(), a collective every rank reaches after its
        # session creation: made here, it would make non-chief ranks wait for the chief's
        # restore inside new_group, with its timeout instead of max_wait_secs.
        self._group: Any = None
        # Agreements are created in the same order on every rank: numbered by the process group.
        self._store = dist.PrefixStore(env.agreed_key("agreement"), env.default_store())
        self._watchdog: HangWatchdog | None = None
        self._responder = roll.Responder(self._store, self.rank, self._status)
        self._pending: tuple[Any, torch.Tensor, int] | None = None
        self._buffers = (torch.zeros(SUMMARY_SIZE, dtype=torch.int32), torch.zeros(SUMMARY_SIZE, dtype=torch.int32))
        self._options: Any = None
        self._local_reasons: tuple[tuple[str, ...], str | None] = ((), None)
        self._channel = channel_module.attach(modules, flag_count(self.world_size))
        self._staged: tuple[int, tuple[tuple[str, ...], str | None]] = (0, ((), None))
        self._last_step: int | None = None  # the last boundary decided (what an error names)
        if self._channel is not None:
            self._channel.bind()
        self._finished = False
        self._closed = False
        self.collectives = 0  # how many all_reduces were started (for tests and benchmarks)

    # ---------------------------------------------------------------- the per-step decision
    def decide(self, step: int, requests: Requests) -> Decision:
        """The decision for the boundary after ``step``; starts the collective for the next one."""
        if self._closed:
            raise RuntimeError(f"the agreement of rank {self.rank} is closed")
        if self._finished:  # every rank already stopped at an agreed boundary: nothing to agree
            return Decision(step)
        if self._watchdog is None:
            self._first_boundary()
        self._watchdog.progress(step)
        self._last_step = step
        carried = self._channel.take() if self._channel is not None else None
        if (requests is NO_REQUESTS and self._pending is None and carried is not None
                and not any(carried)):
            # The usual step of a DDP model: nobody asked for anything, this rank has nothing to
            # send. The same outcome as the general path below, without its bookkeeping.
            self._channel.stage(None)
            self._staged = (step, _NO_REASONS)
            return Decision(step)
        decision = self._collect(step)
        # carried is the same on every rank: DDP's all-reduce ran on all of them or on none
        if carried is not None and any(carried):
            decision = merge(decision, self._decode(step, carried, *self._staged))
        if requests.stop and requests.stop_on_every_rank:
            decision = merge(decision, Decision(step, stop=True, stop_reason=requests.stop_reason,
                                                 preempted=requests.preempted))
        if requests.save and requests.save_on_every_rank:  # every rank saves here: not sent on
            decision = merge(decision, Decision(step, save=True, save_reasons=requests.save_reasons))
            requests = Requests(stop_reason=requests.stop_reason) if requests.stop else NO_REQUESTS
        if decision.stop:
            self._finished = True  # every rank stops here: no collective for a next boundary
        elif carried is not None:
            self._stage(step, requests)  # the next backward carries them
        else:
            self._start(step, requests)
        if self._gather_rng and (decision.save or decision.stop):
            states = rng_module.gather(group=self._group, capture=self._capture_rng)
            decision = dataclasses.replace(decision, rng_states=states)
        return decision

    def _first_boundary(self) -> None:
        """Makes the side group (a collective: every rank's first boundary) and the watchdog."""
        import torch.distributed as dist

        self._group = side_group(max(self.stop_grace_secs - self._diagnose_secs, 0.1))
        self._options = dist.AllreduceOptions()
        self._options.reduceOp = dist.ReduceOp.MAX
        self._watchdog = HangWatchdog(self._store, self.rank, self.world_size, grace_secs=self.stop_grace_secs,
                                      responder=self._responder)
        self._watchdog.start()
        self._responder.start()

    def _stage(self, step: int, requests: Requests) -> None:
        if requests is NO_REQUESTS:
            self._channel.stage(None)
            self._staged = (step, _NO_REASONS)
            return
        flags = torch.zeros(flag_count(self.world_size))
        write_flags(flags, requests, rank=self.rank, world_size=self.world_size)
        self._channel.stage(flags)
        self._staged = (step, (requests.save_reasons, requests.stop_reason))

    def _start(self, step: int, requests: Requests) -> None:
        # Two buffers in turn: the one in flight is never the one being filled.
        flags = self._buffers[self.collectives & 1]
        flags.zero_()
        if requests is not NO_REQUESTS:
            write_summary(flags, requests, rank=self.rank, world_size=self.world_size)
            self._local_reasons = (requests.save_reasons, requests.stop_reason)
        else:
            self._local_reasons = ((), None)
        unsent = self._channel.unsent() if self._channel is not None else None
        if unsent is not None:  # staged for a step that did not run DDP's all-reduce
            staged = torch.tensor(summary_of_flags(unsent.tolist(), world_size=self.world_size), dtype=torch.int32)
            flags.copy_(torch.maximum(flags, staged))
            own_saves, own_stop = self._staged[1]
            self._local_reasons = (own_saves + self._local_reasons[0], self._local_reasons[1] or own_stop)
        # The process group's own call: the per-step path skips the Python wrapper's checks.
        work = self._group.allreduce([flags], self._options)
        self.collectives += 1
        self._pending = (work, flags, step)

    def _collect(self, step: int) -> Decision:
        """Waits for the collective started at the previous boundary; its decision applies now."""
        if self._pending is None:
            return Decision(step)
        work, flags, started = self._pending
        self._pending = None
        # Always wait(), even on a completed work: a collective that failed (a peer died or
        # closed its connection) is completed too, and only wait() raises its error.
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001 - a peer died, raised or hung
            raise self._failure(step, e) from e
        return combine_summary(flags.tolist(), step=step, started=started, rank=self.rank,
                               world_size=self.world_size, own_reasons=self._local_reasons)

    def _decode(self, step: int, values: list[Any], started: int,
                local_reasons: tuple[tuple[str, ...], str | None]) -> Decision:
        """The decision of a step from every rank's flags (`supervisor.agreement.combine`)."""
        return combine(values, step=step, started=started, rank=self.rank, own_reasons=local_reasons)

    def _failure(self, step: int, error: BaseException) -> RankFailureError:
        forget_side_group(self._group)  # a group whose collective failed is never reused
        first_line = str(error).splitlines()[0] if str(error) else ""
        ranks, secondary, what = self._culprits(f"{type(error).__name__}: {first_line}")
        message = (f"rank {self.rank} cannot agree on step {step} with the other ranks: {what}; "
                   f"the collective reported: {type(error).__name__}: {first_line}")
        logger.error("%s", message)
        return RankFailureError(message, ranks=ranks, step=step, secondary=secondary)

    def _culprits(self, note: str) -> tuple[tuple[int, ...], tuple[int, ...], str]:
        """Who failed first, who stopped because of it (supervisor.distributed.diagnosis)."""
        return find_culprits(self._store, self.rank, self.world_size, grace_secs=self._diagnose_secs,
                             settle_secs=min(1.0, self._diagnose_secs) if self._responder.available else None,
                             note=note)

    def _status(self) -> str:
        """What this rank's responder answers a diagnosis with."""
        state = "left its session" if self._closed else f"at step {self._last_step}"
        return f"alive, {state}"

    # ---------------------------------------------------------------- leaving
    def report_failure(self, exc: BaseException) -> RankFailureError | None:
        """Posts this rank's error for the others' diagnosis (called as a failed session closes).

        When ``exc`` is itself a failed collective or store call (DDP's all_reduce after a peer
        died, gloo's transport timeout behind a hung peer, a sharded save's ``dcp.save``), the
        ranks that failed first are looked up; returns a `RankFailureError` naming them, chained
        to ``exc`` (None when ``exc`` is this rank's own error, or no other rank is found).
        """
        if isinstance(exc, RankFailureError):
            return None
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        if not is_collective_failure(exc):  # this rank's own error: the one the others blame
            post_failure(self._store, self.rank, f"{type(exc).__name__}: {first_line}")
            return None
        ranks, secondary, what = self._culprits(f"{type(exc).__name__}: {first_line}")
        ranks = tuple(r for r in ranks if r != self.rank)
        if not ranks:
            return None
        step = self._watchdog_step()
        error = RankFailureError(
            f"rank {self.rank} stopped at step {step} because another rank did: {what}; this rank's "
            f"collective reported: {type(exc).__name__}: {first_line}", ranks=ranks, step=step, secondary=secondary)
        error.__cause__ = exc
        logger.error("%s", error)
        return error

    def _watchdog_step(self) -> int | None:
        """The step this rank is at: the boundary whose collective is in flight, else the last
        one decided (after an agreed stop too); None before the first boundary."""
        if self._pending is not None:
            return self._pending[2]
        return self._last_step

    def close(self, error: BaseException | None = None) -> RankFailureError | None:
        """Leaves the agreement. After an agreed stop nothing is in flight; otherwise (this rank
        stops alone, e.g. on an error) the others are told why, so their error can name it.
        Returns the error to raise instead of ``error`` when that is a collective failure caused
        by another rank (`report_failure`), else None."""
        if self._closed:
            return None
        self._closed = True
        if self._channel is not None:
            self._channel.unbind()
        if self._watchdog is not None:
            self._watchdog.close()
        replacement = None
        if error is not None or self._pending is not None:
            forget_side_group(self._group)  # this rank leaves alone: the group is not reusable
        if error is not None:
            replacement = self.report_failure(error)
        elif self._watchdog is not None and not self._finished:
            post_failure(self._store, self.rank, f"left the session at step {self._watchdog_step()} without an agreed stop")
        self._responder.close()
        self._pending = None
        return replacement

    def __repr__(self) -> str:
        return (f"CollectiveAgreement(rank={self.rank}, world_size={self.world_size}, "
                f"stop_grace_secs={self.stop_grace_secs:g})")


# ---------------------------------------------------------------- the side group, reused
_SIDE_GROUPS: dict[float, tuple[Any, Any]] = {}  # timeout secs -> (default group, side group)


def side_group(timeout_secs: float) -> Any:
    """The agreement's gloo group of ``timeout_secs`` (a collective on first use): made once per
    default process group and reused by every later agreement with the same timeout, so a job
    of many sessions holds one extra TCP mesh, not one per session (issue 31.5)."""
    import torch.distributed as dist

    default = dist.distributed_c10d._get_default_group()
    cached = _SIDE_GROUPS.get(timeout_secs)
    if cached is not None and cached[0] is default:
        return cached[1]
    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_secs))
    _SIDE_GROUPS[timeout_secs] = (default, group)
    return group


def forget_side_group(group: Any) -> None:
    """Stops reusing ``group`` (a collective failed on it, or a rank left it mid-agreement)."""
    for key, (_, cached) in list(_SIDE_GROUPS.items()):
        if cached is group:
            del _SIDE_GROUPS[key]
