"""Shared helpers of the hook tests: drive a REAL `MonitoredSession` step by step."""
from __future__ import annotations

from typing import Any, Callable

import torch

from supervisor import MonitoredSession, Restored, SessionCreator


class RestoredAt(SessionCreator):
    """A session creator that "restores" the global step ``step`` (no checkpoint needed)."""

    def __init__(self, step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._step = step

    def restore(self, session: Any) -> Restored:
        return Restored(self._step, "x")


def loss_step() -> dict[str, Any]:
    return {"loss": torch.tensor(0.5)}


def run_steps(hooks: list, n: int, *, step_fn: Callable[..., Any] = loss_step, creator: SessionCreator | None = None,
              clock: Any = None, advance_secs: float = 0.0, **session_kwargs: Any) -> MonitoredSession:
    """Runs up to ``n`` steps (fewer if a hook stops the session), advancing the fake ``clock``
    by ``advance_secs`` inside each step; returns the closed session."""
    def step(**feeds: Any) -> Any:
        if clock is not None:
            clock.advance(advance_secs)
        return step_fn(**feeds)

    with MonitoredSession(creator, hooks=hooks, **session_kwargs) as session:
        for _ in range(n):
            if session.should_stop():
                break
            session.run(step)
    return session
