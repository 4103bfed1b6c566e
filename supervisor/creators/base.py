"""Session creators: the restore-or-initialise policy run at every session creation (§4).

The creator is the *how*; the `SessionEnvironment` it holds is the *where* (logdir, chief,
summary writer, checkpoint manager). `MonitoredSession` calls ``creator.create(session)`` at its
creation and again after every recoverable error. The base `SessionCreator` keeps the state in memory (nothing to restore
from); the checkpoint-backed creators (`supervisor.creators.chief`, ``worker``, ``sharded``) restore from the newest
verified checkpoint. Both follow SPEC §4's order:

1. restore if there is something to restore from (then ``init_fn`` is not called);
2. else ``init_fn(session)`` and ``global_step = 0``;
3. ``local_init_fn(session)``, every time;
4. ``ready_fn(session)``: ``None``/``""`` when ready, else a description of what is not ready;
   the default check fails on uninitialised lazy parameters;
5. one INFO line saying which of the above happened.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable

import torch

from supervisor._validate import check_bool, check_callable
from supervisor.checkpoint.load.apply import Restored
from supervisor.creators.environment import SessionEnvironment
from supervisor.state import TrainingState

__all__ = ["SessionCreator", "Restored", "default_ready_fn", "check_session_fns"]

# The name it logged under before the creators had a package of their own (users and the
# sidecar configure it): kept, so moving the module changed no logging configuration.
logger = logging.getLogger("supervisor.creators")


def default_ready_fn(session: Any) -> str | None:
    """Reports uninitialised lazy parameters (``torch.nn.UninitializedParameter``), if any."""
    missing = []
    for name, obj in session.state.items():
        if isinstance(obj, torch.nn.Module):
            for pname, p in obj.named_parameters(remove_duplicate=False):
                if isinstance(p, torch.nn.parameter.UninitializedParameter):
                    missing.append(f"{name}.{pname}")
    if not missing:
        return None
    return (f"uninitialised lazy parameters {', '.join(missing)}; run a forward pass on a sample "
            "batch in init_fn (and build the optimizer after it)")


class SessionCreator:
    """The restore-or-initialise policy; the base class keeps the state in memory.

    On a re-creation after a recoverable error the in-memory state is kept as it is and the
    global step goes back to where the failed ``run`` started (nothing else to restore from).

    Args:
        state: the `TrainingState`.
        init_fn: ``init_fn(session)``, called when nothing was restored (e.g. a warm start).
        local_init_fn: ``local_init_fn(session)``, called at every creation.
        ready_fn: ``ready_fn(session) -> None | str``; defaults to `default_ready_fn`.
        is_chief, logdir, summary_writer: the `SessionEnvironment` (also reachable as
            ``creator.environment``; subclasses add its checkpoint manager).
    """

    #: A creator that can restore re-runs init_fn when a re-creation finds nothing to restore
    #: (TF's behaviour); the in-memory creator keeps the state it has instead.
    reinitialise_on_recreate = False

    def __init__(
        self,
        state: TrainingState | None = None,
        *,
        init_fn: Callable[[Any], Any] | None = None,
        local_init_fn: Callable[[Any], Any] | None = None,
        ready_fn: Callable[[Any], Any] | None = None,
        is_chief: bool = True,
        logdir: str | None = None,
        summary_writer: Any = None,
    ) -> None:
        if state is not None and not isinstance(state, TrainingState):
            raise TypeError(f"state must be a supervisor.TrainingState, got {state!r}; build one with TrainingState({{...}})")
        self.state = state if state is not None else TrainingState()
        fns = check_session_fns(init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn)
        self.init_fn, self.local_init_fn, self.ready_fn = fns["init_fn"], fns["local_init_fn"], fns["ready_fn"]
        self.environment = SessionEnvironment(logdir=logdir, is_chief=check_bool("is_chief", is_chief),
                                              summary_writer=summary_writer)
        self._created = 0

    # The environment's fields, read by the session (``s.logdir`` ...).
    logdir = property(lambda self: self.environment.logdir)
    is_chief = property(lambda self: self.environment.is_chief)
    summary_writer = property(lambda self: self.environment.summary_writer)
    checkpoints = property(lambda self: self.environment.checkpoints)

    @property
    def checkpoints_per_rank(self) -> bool:
        """Whether every rank's checkpoint manager saves its own part at the same step (a sharded,
        DCP manager): each rank then writes its own RNG state, and the ranks' agreement gathers
        none to the chief."""
        return bool(getattr(self.checkpoints, "collective", False))  # duck-typed managers: False

    def restore(self, session: Any) -> Restored | None:
        """Restores the state from a checkpoint; the in-memory creator has none."""
        return None

    def create(self, session: Any) -> int | None:
        """Makes the state ready; returns the global step to continue from (None: keep it)."""
        first = self._created == 0  # counts completed creations: a failed first one runs init_fn again
        restored = self.restore(session)  # the chief's takes the logdir's lock or lease
        self.environment.open_summaries()
        if restored is not None:
            step: int | None = restored.global_step
            message = ("restored step=%d from %s", restored.global_step, restored.path)
        elif first or self.reinitialise_on_recreate:
            self.initialise(session)
            step = 0
            message = ("initialised from scratch",)
        else:
            step = None
            message = ("re-created with the in-memory state at step %d", session.global_step)
        if self.local_init_fn is not None:
            self.local_init_fn(session)
        self.check_ready(session)
        self._created += 1
        logger.info(*message)
        return step

    def initialise(self, session: Any) -> None:
        """Nothing was restored: runs ``init_fn`` (a distributed creator runs it on the chief
        only and gives the other ranks the chief's state, SPEC §4)."""
        if self.init_fn is not None:
            self.init_fn(session)

    def check_ready(self, session: Any) -> None:
        not_ready = (self.ready_fn or default_ready_fn)(session)
        if not_ready:
            raise RuntimeError(f"model not ready after initialisation: {not_ready}")

    def close(self, *, failed: bool) -> None:
        """Releases what the policy itself holds; ``failed``: closing on an error. The
        environment (manager, lock, summary writer) is closed by `shutdown` regardless."""

    def shutdown(self, *, failed: bool) -> None:
        """What the session calls at close: `close`, then the environment."""
        try:
            self.close(failed=failed)
        finally:
            self.environment.close(failed=failed)


_SESSION_FN_SIGNATURES = {"init_fn": "init_fn(session)", "local_init_fn": "local_init_fn(session)",
                          "ready_fn": "ready_fn(session) -> None | str"}


def check_session_fns(**fns: Any) -> dict[str, Callable[[Any], Any] | None]:
    """Validates ``init_fn``, ``local_init_fn`` and ``ready_fn`` (each None or a callable taking
    the session); returns them by name. Every front door calls it at construction."""
    return {name: _check_session_fn(name, fn, _SESSION_FN_SIGNATURES[name]) for name, fn in fns.items()}


def _check_session_fn(name: str, fn: Any, signature: str) -> Callable[[Any], Any] | None:
    """A callable that takes the session as its one argument, checked here (issue 22.20): the
    wrong arity would otherwise fail only when the session is entered."""
    fn = check_callable(name, fn, signature=signature)
    if fn is None:
        return None
    try:
        params = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return fn
    try:
        params.bind(None)
    except TypeError:
        raise TypeError(f"{name} must take one argument, the session ({signature}), got {fn!r} with "
                        f"parameters {params}; e.g. def {name}(session): ...") from None
    return fn
