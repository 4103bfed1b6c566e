"""Exact resume with real training loops (SPEC §2 "Exact resume").

A checkpoint of step N holds the training state and the RNG states captured at the boundary of
step N. A resumed run is exact when step N+1 starts with the same global RNG, the same data
position and the same loader generators as it does in the uninterrupted run. Three things stood
in the way with torchdata's ``StatefulDataLoader`` (read from its source):

1. **Iterators draw from the global RNG.** Every ``iter(loader)`` builds an iterator, and every
   iterator draws one "base seed" from ``loader.generator`` — from the *global* torch RNG when
   the loader has no ``generator=``. A restored loader builds its iterator from the loaded
   state at the loop's first ``iter(loader)``, *after* the RNG was restored, so the resumed run
   drew one number more than the uninterrupted one (which was still iterating the iterator it
   built at the epoch start). Restoring the RNG later (at the first ``run()``) is wrong too: at
   an epoch end the uninterrupted run *does* draw a base seed for the next epoch's iterator
   before step N+1, a mid-epoch resume must not.
2. **The loader's own generator is not in its state.** With ``generator=g``, the iterator's
   state holds ``g`` as it was *before* the epoch's permutation and base seed; loading it
   rewinds ``g`` and replays the permutation but not the base seed, so from the next epoch on
   the shuffle differs.
3. **Session creation may draw** (``local_init_fn``, a hook's ``after_create_session``): the
   uninterrupted run drew that at step 0, the resumed run draws it again after the restore.

The design, applied wherever a checkpoint is applied (`apply_checkpoint`):

- **Prime the restored loaders**: right after the state is loaded and *before* the RNG is
  restored, each restored ``StatefulDataLoader`` builds its iterator from the loaded state
  (``loader.state_dict()`` does exactly that and marks it for reuse by the next
  ``iter(loader)``). The draws of that construction are then overwritten by the restore, and the
  loop's ``iter(loader)`` reuses the primed iterator without drawing — mid-epoch. At an epoch end
  the primed iterator is finished, so ``iter(loader)`` builds the next epoch's iterator and draws
  exactly what the uninterrupted run drew. Whatever order the loop creates iterators in, each
  draw happens in both runs or in neither.
- **Capture the loaders' generators** with the RNG state (``generators`` in `supervisor.state.rng`,
  per rank) and restore them after priming, so ``g`` continues where it was.
- **Reinstate at the end of creation**: `reinstate` re-applies the restored RNG state after
  ``local_init_fn``, ``ready_fn`` and every ``after_create_session`` hook, so nothing creation
  does shifts the streams.

What cannot be made exact is detected where it can be and named in a WARNING:

- a loader that already had a live iterator when its state was loaded (``iter(loader)`` called
  before the session was created, or a recovery inside the loop): that iterator keeps its old
  position;
- a checkpoint without the state of a loader's ``generator=`` (written before this module, or
  by another tool): the shuffle differs from the next epoch on.

Not detectable, documented in the README: random draws inside a ``Dataset`` read by worker
processes (each worker's RNG restarts from its seed after a resume).
"""
from __future__ import annotations

import copy
import logging
import sys
from typing import Any

import torch

from supervisor.state.rng import restore_rng_state

__all__ = ["stateful_loaders", "loader_generators", "live_iterators", "prime_loaders", "restore_rng",
           "begin_creation", "reinstate"]

logger = logging.getLogger(__name__)

_TORCHDATA = "torchdata.stateful_dataloader.stateful_dataloader"
_CREATION = "_supervisor_resume_creation"  # attribute of a TrainingState during a session creation


def stateful_loaders(state: Any) -> list[tuple[str, Any]]:
    """The ``(name, loader)`` entries of ``state`` that are torchdata ``StatefulDataLoader`` s.

    torchdata is never imported here: when nobody imported it, no entry can be one.
    """
    module = sys.modules.get(_TORCHDATA)
    cls = getattr(module, "StatefulDataLoader", None)
    if cls is None:
        return []
    return [(name, obj) for name, obj in state.items() if isinstance(obj, cls)]


def loader_generators(state: Any) -> dict[str, torch.Generator]:
    """The generators the training state's loaders own, by name (``"data.generator"``,
    ``"data.sampler.generator"``, ``"data.batch_sampler.sampler.generator"``), each object once."""
    found: dict[str, torch.Generator] = {}
    seen: set[int] = set()
    for name, loader in stateful_loaders(state):
        batch_sampler = getattr(loader, "batch_sampler", None)
        owners = (("generator", loader), ("sampler.generator", getattr(loader, "sampler", None)),
                  ("batch_sampler.sampler.generator", getattr(batch_sampler, "sampler", None)))
        for path, owner in owners:
            g = getattr(owner, "generator", None)
            if isinstance(g, torch.Generator) and id(g) not in seen:
                seen.add(id(g))
                found[f"{name}.{path}"] = g
    return found


def live_iterators(state: Any) -> list[str]:
    """Names of the loaders that hold an unfinished iterator the loop may still be using; call
    it before loading a checkpoint into ``state``."""
    live = []
    for name, loader in stateful_loaders(state):
        iterator = getattr(loader, "_iterator", None)
        if (iterator is not None and not getattr(loader, "_initial_iter_for_state_dict", False)
                and not getattr(iterator, "_finished", False)):
            live.append(name)
    return live


def prime_loaders(state: Any, live: list[str], where: str) -> None:
    """Builds each restored loader's iterator now, before the RNG is restored (module doc);
    warns about the loaders in ``live`` (from `live_iterators` before the load)."""
    for name in live:
        logger.warning(
            "exact resume: the StatefulDataLoader %r had an iterator in use when %s was restored "
            "into it (iter(loader) was called before the session was created, or the session is "
            "recovering inside the loop); that iterator keeps its old position, so the batches "
            "will differ from an uninterrupted run. Create the iterator inside the session "
            "(`for batch in loader:` within the `with`)", name, where)
    for name, loader in stateful_loaders(state):
        loader.state_dict()  # builds the iterator from the loaded state; iter(loader) reuses it
        if getattr(loader, "_iterator", None) is None or not getattr(loader, "_initial_iter_for_state_dict", False):
            logger.warning(  # a torchdata that no longer keeps that iterator for the next iter()
                "exact resume: the StatefulDataLoader %r did not keep the iterator built from %s "
                "for its next iter() (torchdata changed?); the first resumed steps may draw other "
                "random numbers than an uninterrupted run", name, where)


def restore_rng(rng: Any, state: Any, *, where: str) -> None:
    """Restores the global generators and the loaders' generators from ``rng`` (after
    `prime_loaders`); during a session creation (`begin_creation`) keeps a copy for `reinstate`.

    Raises:
        CheckpointError: the RNG state is malformed (``where`` names the checkpoint).
    """
    generators = loader_generators(state)
    missing = restore_rng_state(rng, where=where, generators=generators)
    for name in missing:
        if name.endswith(".sampler.generator"):
            continue  # torchdata's own sampler generator: its state is in the loader's state
        logger.warning(
            "exact resume: %s holds no state for the generator %s (written by an older "
            "torch-supervisor?); the data order will differ from an uninterrupted run from the "
            "next epoch on", where, name)
    creation = getattr(state, _CREATION, None)
    if creation is not None:
        # A copy: the loaded tensors may map the checkpoint file, which must not stay mapped.
        creation["rng"], creation["where"] = copy.deepcopy(rng), where


def begin_creation(state: Any) -> None:
    """Marks the start of a session creation: a checkpoint restored from now on is re-applied
    by `reinstate` (a restore outside a session creation is not)."""
    setattr(state, _CREATION, {"rng": None, "where": ""})


def reinstate(state: Any) -> None:
    """Ends the creation `begin_creation` started: re-applies the RNG state restored during it,
    if any. Call it as the creation's last act (after ``local_init_fn`` and the
    ``after_create_session`` hooks), so that nothing the creation drew shifts the streams."""
    creation = getattr(state, _CREATION, None)
    if creation is None:
        return
    delattr(state, _CREATION)
    if creation["rng"] is not None:
        restore_rng_state(creation["rng"], where=creation["where"], generators=loader_generators(state))

