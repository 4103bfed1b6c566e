"""An agreement rule you add yourself: a preempted job checkpoints before it goes.

A decision rule is a pure function ``Decision -> Decision`` registered with
`supervisor.agreement.register_rule`. The step boundary applies it to every agreed decision
that saves or stops, on every rank, after the ranks agreed (docs/development.md, "Contributor
exercises"). This one: when the agreed stop is a preemption (SIGTERM/SIGINT on any rank), every
rank also captures a checkpoint at that step — also in a session that saves on no schedule.
It reads only the agreed fields (``stop``, ``preempted``, ``save``), so the ranks stay in step.

    import examples.save_on_preemption as rule
    rule.register()          # from now on, in this process
"""
from __future__ import annotations

import dataclasses

from supervisor.agreement import Decision, register_rule, unregister_rule

REASON = "preempted: a checkpoint before the job goes"


def save_on_preemption(decision: Decision) -> Decision:
    """``decision``, with a save added when it is a preempted stop that does not save already."""
    if decision.stop and decision.preempted and not decision.save:
        return dataclasses.replace(decision, save=True, save_reasons=decision.save_reasons + (REASON,))
    return decision


def register() -> None:
    """Applies `save_on_preemption` to every decision of this process's sessions."""
    register_rule(save_on_preemption)


def unregister() -> None:
    unregister_rule(save_on_preemption)
