"""TEMPORARY stand-in (dist branch): the protocol types of the lead's supervisor/boundary.py,
copied so the collective agreement can be built and tested before boundary.py lands on main.
Replaced by the real module at `git merge main`."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Agreement", "Decision", "NO_REQUESTS", "Requests"]


@dataclass(frozen=True)
class Requests:
    """What one process asked for since the last boundary: the input of an `Agreement`.

    Attributes:
        save_reasons: why a save was asked for (empty: no save requested).
        stop_reason: why a stop was asked for (None: no stop requested).
        stop_on_every_rank: the stop is one every process requests at this same step (e.g. a
            step count known to all ranks, `StopAtStepHook`), so an agreement may apply it at once.
    """

    save_reasons: tuple[str, ...] = ()
    stop_reason: str | None = None
    stop_on_every_rank: bool = False

    @property
    def save(self) -> bool:
        return bool(self.save_reasons)

    @property
    def stop(self) -> bool:
        return self.stop_reason is not None


NO_REQUESTS = Requests()


@dataclass(frozen=True)
class Decision:
    """What every process does at a boundary: capture a checkpoint, stop, or both."""

    step: int
    save: bool = False
    stop: bool = False
    save_reasons: tuple[str, ...] = ()
    stop_reason: str | None = None


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
                        save_reasons=requests.save_reasons, stop_reason=requests.stop_reason)

    def close(self) -> None:
        """Releases what the agreement holds (process groups, pending collectives)."""


LocalAgreement = Agreement
