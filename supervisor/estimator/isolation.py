"""Work beside training that must leave it undisturbed: `preserved_rng` (evaluation, prediction
and export run under it, so training that evaluates in between ends bit-identical)."""
from __future__ import annotations

import contextlib
from typing import Iterator

from supervisor.state.rng import capture_rng_state, restore_rng_state

__all__ = ["preserved_rng"]


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Restores every RNG of the process (Python, NumPy, torch CPU and CUDA) on exit."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state, where="the state saved before an evaluation")
