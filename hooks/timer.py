"""`SecondOrStepTimer`: "every N steps or every N seconds", with TensorFlow's semantics."""
from __future__ import annotations

from supervisor.clock import Clock, resolve_clock
from supervisor.hook import IdleUntil
from supervisor.toolkit import check_schedule


__all__ = ["SecondOrStepTimer", "NeverTriggerTimer"]


class SecondOrStepTimer:
    """Decides when a periodic action is due, by steps or by seconds (exactly one of them).

    TF semantics: the first step asked about always triggers; a step never triggers twice in a
    row; by steps, step ``s`` triggers when ``s >= last_triggered_step + every_steps``; by
    seconds, when ``every_secs`` have passed since the last trigger (on the clock's monotonic
    time). The caller records a trigger with `update_last_triggered_step`.

    Example::

        timer = SecondOrStepTimer(every_steps=100)
        if timer.should_trigger_for_step(step):
            elapsed_secs, elapsed_steps = timer.update_last_triggered_step(step)

    Args:
        every_secs: trigger when this many seconds have passed since the last trigger.
        every_steps: trigger when the step has advanced this much since the last trigger.
        clock: injectable clock (`supervisor.testing.FakeClock` in tests).
    """

    __slots__ = ("_every_secs", "_every_steps", "_clock", "_last_step", "_last_time")

    def __init__(self, every_secs: float | None = None, every_steps: int | None = None, *,
                 clock: Clock | None = None) -> None:
        self._every_steps, self._every_secs = check_schedule(
            "SecondOrStepTimer", ("every_steps", every_steps), ("every_secs", every_secs))
        self._clock = resolve_clock(clock)
        self._last_step: int | None = None
        self._last_time: float | None = None

    @property
    def every_secs(self) -> float | None:
        return self._every_secs

    @property
    def every_steps(self) -> int | None:
        return self._every_steps

    def reset(self) -> None:
        """Forgets the last trigger: the next step asked about triggers."""
        self._last_step = None
        self._last_time = None

    def should_trigger_for_step(self, step: int) -> bool:
        """Whether the action is due at ``step`` (cheap: no clock read on a step schedule)."""
        last = self._last_step
        if last is None:
            return True
        if last == step:
            return False
        if self._every_steps is not None:
            return step >= last + self._every_steps
        return self._clock.monotonic() >= self._last_time + self._every_secs

    def trigger_if_due(self, step: int) -> bool:
        """`should_trigger_for_step`, recording the trigger when it is due."""
        if not self.should_trigger_for_step(step):
            return False
        self.update_last_triggered_step(step)
        return True

    def idle_until(self) -> IdleUntil | None:
        """When this schedule may trigger next, as a hook declares it (`Hook.idle_until`): not
        before the global step reaches the next multiple, not before the clock reaches the next
        interval, or None (it may at the next step asked about)."""
        if self._last_step is None:
            return None
        if self._every_steps is not None:
            return IdleUntil.step_reaches(self._last_step + self._every_steps)
        return IdleUntil.clock_reaches(self._clock.monotonic, self._last_time + self._every_secs)

    def update_last_triggered_step(self, step: int) -> tuple[float | None, int | None]:
        """Records a trigger at ``step``; returns ``(elapsed_secs, elapsed_steps)`` since the
        previous one, ``(None, None)`` for the first."""
        now = self._clock.monotonic()
        if self._last_time is None:
            elapsed: tuple[float | None, int | None] = (None, None)
        else:
            elapsed = (now - self._last_time, step - self._last_step)
        self._last_time, self._last_step = now, step
        return elapsed

    def last_triggered_step(self) -> int | None:
        """The step of the last trigger, or None."""
        return self._last_step

    def __repr__(self) -> str:
        every = f"every_steps={self._every_steps}" if self._every_steps else f"every_secs={self._every_secs}"
        return f"SecondOrStepTimer({every}, last_triggered_step={self._last_step})"


class NeverTriggerTimer:
    """A timer that never triggers (TF's), for hooks that act only at the end."""

    __slots__ = ("_last_step", "_clock", "_last_time")

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = resolve_clock(clock)
        self.reset()

    def reset(self) -> None:
        self._last_step: int | None = None
        self._last_time: float | None = None

    def should_trigger_for_step(self, step: int) -> bool:
        return False

    def update_last_triggered_step(self, step: int) -> tuple[float | None, int | None]:
        now = self._clock.monotonic()
        elapsed = (None, None) if self._last_time is None else (now - self._last_time, step - self._last_step)
        self._last_time, self._last_step = now, step
        return elapsed

    def last_triggered_step(self) -> int | None:
        return self._last_step
