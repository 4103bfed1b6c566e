"""`frozen_heap`: the objects that exist before a benchmark starts (torch, its lazily imported
``torch._dynamo``, the caller's own: a pytest session's whole heap in the smoke tests) are moved
out of the garbage collector's reach while it runs.

The benchmarks call ``gc.collect()`` between rounds so that one round's garbage is not collected
in the middle of the next. A full collection walks every tracked object: ~0.2 s per call with
torch imported, more inside pytest, and the quick runs make dozens of them — most of a smoke
test's time went there. Frozen objects are never collected (they are not garbage: modules,
functions, the caller's state), so each ``gc.collect()`` walks only what the benchmark itself
allocated, and collects all of it as before: what the figures measure is unchanged (the memory
rows included: their garbage is the benchmark's own, never frozen). The automatic collections
during a timed loop get cheaper the same way, which only removes noise a real training process
with a frozen heap would not pay either. (`gc.freeze` is CPython's tool for exactly this.)
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch._dynamo  # noqa: F401  (torch imports it at the first optimizer: ~150,000 objects, frozen too)

__all__ = ["frozen_heap"]


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Freezes every object alive now for the block; unfreezes them after (unless a caller had
    frozen some already: then theirs and ours stay frozen, as they were)."""
    caller_froze = gc.get_freeze_count() > 0
    gc.collect()  # what is garbage now is collected once, not frozen
    gc.freeze()
    try:
        yield
    finally:
        if not caller_froze:
            gc.unfreeze()
