"""How one process's save/stop requests become the decision every process applies (SPEC §3.5, §12).

Values in, values out: a `Requests` (what this process asked for since the last boundary) goes
into an `Agreement`, a `Decision` comes out. The base `Agreement` is the identity, for one
process; the collective one (`supervisor.distributed.agreement`) sends each rank's requests as
flags and turns every rank's flags back into a decision with `combine` — a pure function.

Decision rules, the seam for a new rule: a pure function ``Decision -> Decision`` given to
`register_rule` is applied by the step boundary to every agreed decision that saves or stops,
after the agreement (one process or many: the same place). It reads the agreed fields (``step``,
``save``, ``stop``, ``preempted``: equal on every rank), so it keeps the ranks in agreement with
no collective of its own; a new rule is one module and its table test, no process group needed
(examples/save_on_preemption.py, docs/development.md).

The flag layout, written once here: ``2 × world_size`` integers, reduced with MAX across ranks;
``flags[rank]`` is rank's save flag (1: a save), ``flags[world_size + rank]`` its stop flag
(1: a stop, `PREEMPTED_FLAG`: a stop caused by SIGTERM/SIGINT). It rides in DDP's gradient
all-reduce (a sum: one slot per rank keeps every value exact in any float dtype).

The summary layout, for the agreement's own collective (issue 31.5: O(1) in the world size):
`SUMMARY_SIZE` integers, MAX-reduced — ``[save, stop flag, W - lowest saver, highest saver + 1,
W - lowest stopper]`` — enough for the same decision on every rank (save, stop, preempted) and
to name a requesting rank (the lowest and highest savers, the lowest stopper).

Example::

    flags = [0] * 4                       # two ranks
    write_flags(flags, Requests(stop_reason="SIGTERM", preempted=True), rank=1, world_size=2)
    combine(flags, step=8, started=7, rank=0)
    # Decision(step=8, stop=True, stop_reason='stop requested on rank 1 at step 7', preempted=True)
"""
from __future__ import annotations

from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["NO_REQUESTS", "PREEMPTED_FLAG", "RULES", "SUMMARY_SIZE", "Agreement", "Decision", "LocalAgreement",
           "Requests", "apply_rules", "combine", "combine_summary", "flag_count", "merge", "register_rule",
           "stop_flag", "summary_of_flags", "unregister_rule", "write_flags", "write_summary"]

#: The stop flag of a stop caused by SIGTERM/SIGINT (MAX keeps it over a plain stop).
PREEMPTED_FLAG = 2


@dataclass(frozen=True)
class Requests:
    """What one process asked for since the last boundary: the input of an `Agreement`.

    Attributes:
        save_reasons: why a save was asked for (empty: no save requested).
        stop_reason: why a stop was asked for (None: no stop requested).
        stop_on_every_rank: the stop is one every process requests at this same step (e.g. a
            step count known to all ranks, `StopAtStepHook`), so an agreement may apply it at once.
        save_on_every_rank: likewise for a save (a step schedule every rank runs, e.g. the
            ``save_checkpoint_steps`` of `MonitoredTrainingSession`).
        preempted: the stop was caused by a signal (SIGTERM/SIGINT): the run is not finished.
    """

    save_reasons: tuple[str, ...] = ()
    stop_reason: str | None = None
    stop_on_every_rank: bool = False
    save_on_every_rank: bool = False
    preempted: bool = False

    @property
    def save(self) -> bool:
        return bool(self.save_reasons)

    @property
    def stop(self) -> bool:
        return self.stop_reason is not None


NO_REQUESTS = Requests()


@dataclass(frozen=True)
class Decision:
    """What every process does at a boundary: capture a checkpoint, stop, or both.

    ``preempted``: a signal on some process caused the stop (every process reports preempted).
    ``rng_states``: every rank's RNG state (``{rank: state}``) when the agreement gathered them
    for this boundary's capture (on the chief of a distributed job; None otherwise)."""

    step: int
    save: bool = False
    stop: bool = False
    save_reasons: tuple[str, ...] = ()
    stop_reason: str | None = None
    preempted: bool = False
    rng_states: Mapping[int, Any] | None = None


class Agreement:
    """Combines one process's `Requests` into the `Decision` every process applies.

    The base class is the identity, for one process: the requests of step N are the decision of
    step N. A distributed agreement (``supervisor.distributed``) combines the requests of every
    rank with one small collective per step, started at boundary N and applied at N+1, so every
    rank stops and captures each checkpoint at the same step.
    """

    #: Whether a decision can be taken between steps without the other processes (the identity
    #: can; a collective cannot, since every rank must call it the same number of times).
    local = True

    def decide(self, step: int, requests: Requests) -> Decision:
        """The decision for the boundary after ``step``, given this process's ``requests``."""
        if requests is NO_REQUESTS:
            return Decision(step)
        return Decision(step, save=requests.save, stop=requests.stop,
                        save_reasons=requests.save_reasons, stop_reason=requests.stop_reason,
                        preempted=requests.stop and requests.preempted)

    def close(self, error: BaseException | None = None) -> BaseException | None:
        """Releases what the agreement holds (process groups, pending collectives); ``error``:
        the session is closing because of it (a collective agreement tells the other ranks).
        Returns the error the session raises instead of ``error`` (a collective agreement names
        the rank whose failure made this rank's collective fail), or None."""
        return None


LocalAgreement = Agreement


# ---------------------------------------------------------------- the flag layout and its rule
def flag_count(world_size: int) -> int:
    """How many flags the ranks exchange: a save and a stop flag per rank."""
    return 2 * world_size


def stop_flag(requests: Requests) -> int:
    """A rank's stop flag: 0 none, 1 a stop, `PREEMPTED_FLAG` a stop caused by a signal."""
    if not requests.stop:
        return 0
    return PREEMPTED_FLAG if requests.preempted else 1


def write_flags(flags: MutableSequence[Any], requests: Requests, *, rank: int, world_size: int) -> None:
    """Writes ``rank``'s flags for ``requests`` into ``flags`` (a list or a tensor, zeroed)."""
    flags[rank] = int(requests.save)
    flags[world_size + rank] = stop_flag(requests)


def combine(flags: Sequence[Any], *, step: int, started: int, rank: int,
            own_reasons: tuple[tuple[str, ...], str | None] = ((), None)) -> Decision:
    """The decision of the boundary after ``step`` from every rank's reduced ``flags`` (sent
    at the boundary of ``started``). ``own_reasons``: this rank's own ``(save_reasons,
    stop_reason)`` for those flags, kept as they are; other ranks' requests are named by rank."""
    if not any(flags):
        return Decision(step)
    world_size = len(flags) // 2
    savers = [r for r in range(world_size) if flags[r]]
    stoppers = [r for r in range(world_size) if flags[world_size + r]]
    own_saves, own_stop = own_reasons
    save_reasons = tuple(own_saves) + tuple(f"save requested on rank {r} at step {started}"
                                            for r in savers if r != rank)
    stop_reason = None
    if stoppers:
        stop_reason = own_stop if rank in stoppers and own_stop else \
            f"stop requested on rank {stoppers[0]} at step {started}"
    preempted = any(flags[world_size + r] >= PREEMPTED_FLAG for r in stoppers)
    return Decision(step, save=bool(savers), stop=bool(stoppers), save_reasons=save_reasons,
                    stop_reason=stop_reason, preempted=preempted)


def merge(a: Decision, b: Decision) -> Decision:
    """Both decisions at once (a save or a stop of either; ``a``'s step)."""
    return Decision(a.step, save=a.save or b.save, stop=a.stop or b.stop,
                    save_reasons=a.save_reasons + b.save_reasons,
                    stop_reason=a.stop_reason or b.stop_reason,
                    preempted=(a.stop and a.preempted) or (b.stop and b.preempted),
                    rng_states=a.rng_states if a.rng_states is not None else b.rng_states)


# ---------------------------------------------------------------- the summary layout (O(1))
SUMMARY_SIZE = 5


def write_summary(summary: MutableSequence[Any], requests: Requests, *, rank: int, world_size: int) -> None:
    """Folds ``rank``'s ``requests`` into ``summary`` (a zeroed list or tensor) as MAX would."""
    if requests.save:
        summary[0] = 1
        summary[2] = max(summary[2], world_size - rank)
        summary[3] = max(summary[3], rank + 1)
    flag = stop_flag(requests)
    if flag:
        summary[1] = max(summary[1], flag)
        summary[4] = max(summary[4], world_size - rank)


def summary_of_flags(flags: Sequence[Any], *, world_size: int) -> list[int]:
    """The summary of a ``2 × world_size`` flag layout (flags staged for DDP, sent on their own)."""
    summary = [0] * SUMMARY_SIZE
    for r in range(world_size):
        stop = int(flags[world_size + r])
        if flags[r] or stop:
            write_summary(summary, Requests(save_reasons=("",) if flags[r] else (),
                                            stop_reason="" if stop else None, preempted=stop >= PREEMPTED_FLAG),
                          rank=r, world_size=world_size)
    return summary


def combine_summary(summary: Sequence[Any], *, step: int, started: int, rank: int, world_size: int,
                    own_reasons: tuple[tuple[str, ...], str | None] = ((), None)) -> Decision:
    """`combine` for the reduced summary: the same save/stop/preempted on every rank; the other
    ranks' requests named by the lowest and highest saver and the lowest stopper."""
    if not any(summary):
        return Decision(step)
    own_saves, own_stop = own_reasons
    savers = sorted({world_size - int(summary[2]), int(summary[3]) - 1} - {rank}) if summary[0] else []
    save_reasons = tuple(own_saves) + tuple(f"save requested on rank {r} at step {started}" for r in savers)
    stop_reason = None
    if summary[1]:
        stop_reason = own_stop or f"stop requested on rank {world_size - int(summary[4])} at step {started}"
    return Decision(step, save=bool(summary[0]), stop=bool(summary[1]), save_reasons=save_reasons,
                    stop_reason=stop_reason, preempted=int(summary[1]) >= PREEMPTED_FLAG)


# ---------------------------------------------------------------- decision rules (the seam)
#: The registered decision rules, applied in order to every agreed decision that saves or stops.
RULES: list[Callable[[Decision], Decision]] = []


def register_rule(rule: Callable[[Decision], Decision]) -> None:
    """Adds a decision rule: a pure function ``Decision -> Decision`` that the step boundary
    applies, in registration order, to each agreed decision with a save or a stop (a step where
    nobody asked for anything is left alone: no per-step cost). Every rank applies it to the same
    ``step``, ``save``, ``stop`` and ``preempted`` (the agreed fields), so a rule that reads only
    those keeps every rank in agreement; the reasons are this rank's text, for messages only.
    Registered once per process (a second registration of the same function is ignored)."""
    if not callable(rule):
        raise TypeError(f"register_rule(rule): expected a function Decision -> Decision, got {rule!r}")
    if rule not in RULES:
        RULES.append(rule)


def unregister_rule(rule: Callable[[Decision], Decision]) -> None:
    """Removes a rule `register_rule` added (nothing happens if it is not registered)."""
    if rule in RULES:
        RULES.remove(rule)


def apply_rules(decision: Decision) -> Decision:
    """``decision`` after every registered rule, in order (unchanged when none is registered)."""
    for rule in RULES:
        result = rule(decision)
        if not isinstance(result, Decision) or result.step != decision.step:
            raise TypeError(f"the agreement rule {rule!r} returned {result!r} for step {decision.step}; "
                            f"a rule returns a Decision of the same step (dataclasses.replace(decision, ...))")
        decision = result
    return decision
