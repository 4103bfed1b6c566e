"""Which hooks a step calls, and what they ask of it (SPEC §3.2): the session's hook dispatch.

- **Override lists**, computed once: a hook method `Hook` defines as a no-op and a hook does not
  override is never called (`supervisor.hook.overrides`).
- **Schedule fast path**: a hook that declares a schedule (`Hook.idle_until`, e.g. the built-in
  hooks' ``every_n_steps``/``every_secs``) is not called on the steps before that schedule may
  trigger, so a loop with the default hooks calls no hook on most steps. Every hook is called
  again from step `Dispatch.gate_step`, or once ``gate_clock()`` reaches `Dispatch.gate_time`,
  whichever comes first; then `Dispatch.regate` asks the hooks again.
- **Fetches and feeds**: the feeds of a step's ``before_run`` calls merged (`merge_feeds`), and
  each hook's fetches resolved after the step (`results_of`).

The session calls the hooks itself, reading `Dispatch`'s public fields directly on its per-step
path: it is hand-tuned (in a real training loop this code runs from cold caches every step, and
each Python call costs there).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from supervisor.hook import Hook, RunValues, declares_schedule, overrides, resolve_fetches

__all__ = ["NO_RESULTS", "Dispatch", "merge_feeds", "results_of"]

NO_RESULTS = RunValues(None)  # immutable: one for every hook of every step that fetched nothing


class Dispatch:
    """The per-step hook lists of a session and the schedule that idles some of them.

    Attributes (read on the per-step path):
        before_hooks, after_hooks: the hooks overriding ``before_run`` / ``after_run``.
        open_before, open_after: the same without the hooks idle until the gate opens.
        gate_step: the first step (about to be taken) at which every hook is called again.
        gate_clock, gate_time: ... or once ``gate_clock()`` reaches ``gate_time`` (None: no time gate).
    """

    def __init__(self, hooks: list[Hook]) -> None:
        self.hooks = hooks
        self.before_hooks = [h for h in hooks if overrides(h, "before_run")]
        self.after_hooks = [h for h in hooks if overrides(h, "after_run")]
        self.scheduled = [h for h in hooks if declares_schedule(h)
                          and (h in self.before_hooks or h in self.after_hooks)]
        self.open_before = [h for h in self.before_hooks if h not in self.scheduled]
        self.open_after = [h for h in self.after_hooks if h not in self.scheduled]
        self.gate_step: float = 0
        self.gate_clock: Callable[[], float] | None = None
        self.gate_time = 0.0

    def overriding(self, method: str) -> list[Hook]:
        """The hooks overriding ``method`` (``begin``, ``end``...), in list order."""
        return [h for h in self.hooks if overrides(h, method)]

    def reset(self) -> None:
        """Every hook at the next step (a session creation resets the schedules: ask again)."""
        self.gate_step, self.gate_clock = 0, None

    def time_gate_opened(self) -> bool:
        """Whether a time-gated hook's deadline passed (during the step that just ran)."""
        return self.gate_clock is not None and self.gate_clock() >= self.gate_time

    def regate(self, upcoming: int) -> None:
        """After a step that called every hook: which scheduled hooks are idle until when, for
        the step ``upcoming`` about to be taken. Anything unsure (time gates on different
        clocks) stays active: calling a hook more often than needed is always correct."""
        idle = []
        step_gate, clock, time_gate = float("inf"), None, float("inf")
        for hook in self.scheduled:
            due = hook.idle_until()
            if due is None:
                continue
            if due.clock is None:
                if due.step is not None and due.step > upcoming:
                    idle.append(hook)
                    step_gate = min(step_gate, due.step)
            elif (clock is None or due.clock == clock) and due.clock() < due.time:
                idle.append(hook)
                clock, time_gate = due.clock, min(time_gate, due.time)
        self.gate_step = step_gate if idle else 0
        self.gate_clock, self.gate_time = clock, time_gate
        if idle:
            self.open_before = [h for h in self.before_hooks if h not in idle]
            self.open_after = [h for h in self.after_hooks if h not in idle]


def results_of(before: list[Hook], fetches: dict[int, Any], output: Any) -> dict[int, Any]:
    """Each hook's fetches resolved against the step's ``output``, by ``id(hook)``."""
    return {key: resolve_fetches(f, output, hook) for hook in before
            if (f := fetches.get(key := id(hook))) is not None}


def merge_feeds(feeds: dict, feeders: dict, new: Mapping[str, Any], hook: Hook, kwargs: dict) -> None:
    """Adds ``hook``'s feeds; a name fed twice, or already passed to ``run``, is an error."""
    if not isinstance(new, Mapping):
        raise TypeError(f"{type(hook).__name__}.before_run returned feeds={new!r}; feeds must be a dict")
    for name, value in new.items():
        if name in kwargs:
            raise RuntimeError(f"{type(hook).__name__} feeds {name!r}, which the caller of run() "
                               "already passed; the step was not run")
        if name in feeders:
            raise RuntimeError(f"{type(feeders[name]).__name__} and {type(hook).__name__} both feed "
                               f"{name!r}; the step was not run")
        feeds[name] = value
        feeders[name] = hook
