"""The step boundary: the one place where saves and stops happen (SPEC §3.5).

During a step, hooks, service threads, signals and the session API only *request*: a save (with
why) or a stop (with a reason, optionally an exception). After the last ``after_run`` of a step
the session resolves every request once, in a fixed order:

1. **deliver** the commit notifications the checkpoint writer reported since the last boundary
   (`CheckpointSaverListener.after_save` runs here, on the training thread, after the commit;
   returning True is a stop request at this boundary);
2. **agree** — an `Agreement` combines this process's requests into the `Decision` every process
   applies (the identity on one process; a collective under ``torch.distributed``, §12);
3. **capture** — the single call of the checkpoint managers' ``save``: step N's checkpoint holds
   every hook's ``after_run`` of step N, under every front door. A manager with listeners first
   waits for its save in flight (the capture would wait for it anyway) and delivers that
   commit, so listener calls alternate (``before_save(N)``, ``after_save(N)``,
   ``before_save(N+1)``...);
4. **stop** — apply the stop; the final checkpoint is captured at this same boundary.

Between two ``run`` calls the session is already at a boundary: ``s.save_checkpoint()`` captures
at once. ``s.request_stop()`` on the training thread between steps also takes effect at once when
the agreement is local; otherwise (distributed) it applies at the next boundary on every rank.

Example: what a hook does to have a checkpoint taken after this step::

    def after_run(self, run_context, run_values):
        if run_values.results > self.best:
            run_context.session.request_save("new best loss")
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from supervisor.agreement import NO_REQUESTS, RULES, Agreement, Decision, LocalAgreement, Requests, apply_rules
from supervisor.checkpoint import check_loadable

if TYPE_CHECKING:
    from supervisor.checkpoint import CheckpointManager, PendingSave

# Requests, Decision, Agreement and LocalAgreement live in supervisor.agreement; re-exported here,
# where they were first published.
__all__ = ["Agreement", "Commit", "Decision", "LocalAgreement", "Requests", "StepBoundary"]

logger = logging.getLogger(__name__)
# The stop is the session's lifecycle event: logged under the session's name, as before the
# boundary owned it (users and the sidecar evaluator's quiet sessions filter on that name).
session_logger = logging.getLogger("supervisor.engine.session")


@dataclass(frozen=True)
class Commit:
    """A committed checkpoint, as the writer reported it."""

    step: int
    path: str


@dataclass
class _Listener:
    listener: Any
    manager: Any


class StepBoundary:
    """Collects requests during a step and resolves them at the boundary (see module docstring).

    Owned by a `MonitoredSession`; thread-safe for requests. Hooks reach it through the session
    (``session.request_save``, ``session.request_stop``, ``session.add_checkpoint_listener``).
    It also holds the outcome: whether a boundary decided to stop (`stopped`), why
    (`stop_reason`), and whether a signal caused it (`preempted`).

    Args:
        agreement: how this process's requests become the decision (default: the identity).

    Attributes (read on the session's per-step path, without the lock):
        pending: requests or commit notifications wait for the next boundary.
        actions_pending: `call_at_boundary` actions wait for the next boundary.
    """

    def __init__(self, agreement: Agreement | None = None) -> None:
        self.agreement = agreement if agreement is not None else Agreement()
        self._lock = threading.Lock()
        self._save_reasons: list[str] = []
        self._stop_reason: str | None = None
        self._stop_on_every_rank = False
        self._save_on_every_rank = False
        self._stop_preempted = False
        self.pending = False
        self.actions_pending = False
        self._actions: list[Callable[[Any], Any]] = []
        self._stop_actions: list[Callable[[Any], Any]] = []
        self.stopped = False
        self.stop_reason: str | None = None
        self.preempted = False
        self._commits: deque[tuple[Any, Commit]] = deque()
        self._listeners: list[_Listener] = []
        self._final_save_managers: list[Any] = []
        self._creation_steps: dict[int, int] = {}
        self._save_managers: list[Any] = []
        self._managers: list[Any] = []  # every manager a capture went through

    # ---------------------------------------------------------------- requests (any thread)
    @property
    def stop_pending(self) -> bool:
        """Whether a stop was requested and waits for the next boundary."""
        return self._stop_reason is not None

    @property
    def only_every_rank_requests(self) -> bool:
        """Whether what waits is only what every rank requests at this step (so every rank
        resolves it here, e.g. at creation, without an agreement's collective)."""
        with self._lock:
            stop_ok = self._stop_reason is None or self._stop_on_every_rank
            save_ok = not self._save_reasons or self._save_on_every_rank
            return stop_ok and save_ok and not self._commits and (
                self._stop_reason is not None or bool(self._save_reasons))

    def request_save(self, reason: str, manager: Any = None, *, on_every_rank: bool = False) -> None:
        """A save at the next boundary, through ``manager`` (default: the session's)."""
        with self._lock:
            self._save_reasons.append(reason)
            self._save_managers.append(manager)
            self._save_on_every_rank = self._save_on_every_rank or on_every_rank
            self.pending = True

    def request_stop(self, reason: str, *, on_every_rank: bool = False, preempted: bool = False) -> None:
        """A stop at the next boundary; ``preempted``: caused by a signal (it reaches every rank)."""
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason
                self._stop_on_every_rank = on_every_rank
            self._stop_preempted = self._stop_preempted or preempted
            self.pending = True

    def report_commit(self, manager: Any, step: int, path: str) -> None:
        """A checkpoint committed (from the writer thread): delivered at the next boundary."""
        with self._lock:
            self._commits.append((manager, Commit(step, path)))
            self.pending = True

    def call_at_boundary(self, action: Callable[[Any], Any]) -> None:
        """Runs ``action(session)`` on the training thread at the next boundary (any thread)."""
        with self._lock:
            self._actions.append(action)
            self.actions_pending = True

    def call_when_stopping(self, action: Callable[[Any], Any]) -> None:
        """Runs ``action(session)`` once at the boundary that decides the stop."""
        self._stop_actions.append(action)

    def take_requests(self) -> Requests:
        with self._lock:
            if not (self._save_reasons or self._stop_reason is not None):
                self.pending = bool(self._commits)
                return NO_REQUESTS
            requests = Requests(tuple(self._save_reasons), self._stop_reason, self._stop_on_every_rank,
                                self._save_on_every_rank, self._stop_preempted and self._stop_reason is not None)
            self._clear_requests()
            self.pending = bool(self._commits)
            return requests

    def take_commits(self) -> list[tuple[Any, Commit]]:
        with self._lock:
            commits = list(self._commits)
            self._commits.clear()
            self.pending = bool(self._save_reasons or self._stop_reason is not None)
            return commits

    def _clear_requests(self) -> None:
        self._save_reasons.clear()
        self._stop_reason = None
        self._stop_on_every_rank = self._save_on_every_rank = self._stop_preempted = False

    def clear(self) -> None:
        """Forgets requests, actions and registrations (a session re-creation registers them
        again). Undelivered commit notifications are kept: the checkpoints did commit."""
        with self._lock:
            self._clear_requests()
            self._save_managers.clear()
            self._actions.clear()
            self.actions_pending = False
            self.pending = bool(self._commits)
        self._listeners.clear()
        self._final_save_managers.clear()

    def clear_stop_actions(self) -> None:
        """Forgets `call_when_stopping` registrations (each session creation registers them)."""
        self._stop_actions.clear()

    # ---------------------------------------------------------------- registrations (training thread)
    def add_listener(self, listener: Any, manager: Any) -> None:
        self._listeners.append(_Listener(listener, manager))

    def save_at_stop(self, manager: Any) -> None:
        if all(m is not manager for m in self._final_save_managers):
            self._final_save_managers.append(manager)

    @property
    def final_save_managers(self) -> tuple[Any, ...]:
        return tuple(self._final_save_managers)

    def listeners_of(self, manager: Any) -> list[Any]:
        return [entry.listener for entry in self._listeners if entry.manager is manager]

    def is_creation_commit(self, manager: Any, commit: Commit) -> bool:
        if self._creation_steps.get(id(manager)) == commit.step:
            del self._creation_steps[id(manager)]
            return True
        return False

    # ---------------------------------------------------------------- the boundary (training thread)
    def at_boundary(self, session: Any) -> None:
        """Runs the queued actions, turns a coordinator stop into a request, resolves, and
        applies a decided stop: the whole boundary after the step that just ended."""
        if self.actions_pending:
            with self._lock:
                actions, self._actions = self._actions, []
                self.actions_pending = False
            for action in actions:
                action(session)
        coord = session.coord
        if coord.stop_event.is_set() and not self.stopped:
            if coord.exception is not None:
                return  # an error: should_stop() is True, close re-raises it (or run() recovers)
            if not self.stop_pending:
                self.request_stop(coord.describe_stop())
        decision = self.resolve(session, session.global_step)
        if decision.stop and not self.stopped:
            self.preempted = self.preempted or decision.preempted  # a signal on any rank (§12)
            self.apply_stop(session, decision.stop_reason or "stop requested")

    def apply_stop(self, session: Any, reason: str) -> None:
        """The stop: `stopped` becomes True, the stop actions run, the service threads end."""
        self.stopped = True
        self.note_stop_reason(reason)
        session_logger.info("stopping at step %d: %s", session.global_step, self.stop_reason)
        for action in self._stop_actions:
            action(session)
        session.coord.request_stop()  # service threads end

    def mark_preempted(self) -> None:
        """A signal arrived before any stop was decided: the run is not finished (`preempted`)."""
        if not self.stopped:
            self.preempted = True

    def note_stop_reason(self, reason: str) -> None:
        """Records why the session stops (the first reason wins)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def resolve(self, session: Any, step: int) -> Decision:
        """Delivers commits, agrees, captures: steps 1–3 of the module docstring. The caller
        applies the stop (step 4) from the returned decision."""
        if self._commits:
            self.deliver(session, allow_stop=True)
        with self._lock:
            managers, self._save_managers = self._save_managers, []
        decision = self.agreement.decide(step, self.take_requests())
        if RULES and (decision.save or decision.stop):  # the registered rules (supervisor.agreement)
            decision = apply_rules(decision)
        if decision.save:
            # None is the session's own manager; with no request here another rank asked.
            default = session.checkpoint_manager
            managers = [default if m is None else m for m in managers or [None]]
            for manager in _unique([m for m in managers if m is not None]):
                if manager.last_saved_step != step:
                    self.capture(session, manager, step, ", ".join(decision.save_reasons),
                                 rng_states=decision.rng_states)
        if decision.stop:
            for manager in self._final_save_managers:
                if manager.last_saved_step != step:
                    self.capture(session, manager, step, f"final checkpoint ({decision.stop_reason})",
                                 rng_states=decision.rng_states)
        return decision

    def capture(self, session: Any, manager: CheckpointManager, step: int, reason: str, *,
                wait: bool = False, creation: bool = False, rng_states: Any = None) -> str:
        """The one call site of a checkpoint manager's ``save``: listeners' ``before_save``,
        then the capture. The save comes back as a value (`PendingSave`): its commit reaches
        this boundary through its future. ``rng_states``: every rank's RNG states the agreement
        gathered for this step (`Decision.rng_states`), None on one process."""
        if all(m is not manager for m in self._managers):
            # The first save through a manager: what it writes must load at the next resume.
            check_loadable(session.training_state.state_dict(), getattr(manager, "trusted_globals", ()),
                           manager.path_of(step), step)
            self._managers.append(manager)
        listeners = self.listeners_of(manager)
        if listeners:
            self._finish_previous_save(session, manager, step)
        for listener in listeners:
            listener.before_save(session, step)
        if creation:
            self._creation_steps[id(manager)] = step
        logger.debug("capturing the checkpoint of step %d (%s)", step, reason)
        # The summaries added so far (every step <= this one) are made durable before this
        # checkpoint is published: a crash right after its commit keeps their points.
        sync_point = getattr(session.summary_writer, "sync_point", None)
        if getattr(manager, "report_metrics", None) is not None:  # keep_best may rank by the step's outputs
            manager.report_metrics(step, session.last_output, source="outputs")
        pending = manager.start_save(step, session.training_state, wait=wait, rng_states=rng_states,
                                     durable=sync_point() if callable(sync_point) else None)
        pending.committed.add_done_callback(functools.partial(self._committed, manager, pending))
        return pending.path

    def _committed(self, manager: Any, pending: PendingSave, future: Any) -> None:
        """A save's future resolved (on the writer thread): its commit waits for the next boundary."""
        if not future.cancelled() and future.exception() is None:
            self.report_commit(manager, pending.step, pending.path)

    def _finish_previous_save(self, session: Any, manager: CheckpointManager, step: int) -> None:
        """Listener calls alternate as in TF (SPEC §3.5): at most one save is in flight, so this
        capture would wait for the previous commit anyway; wait here instead and deliver that
        commit's ``after_save`` before the next ``before_save``. A stop an ``after_save``
        requests here applies at the next boundary (this one's decision is taken)."""
        start = time.perf_counter()
        manager.wait()
        waited = time.perf_counter() - start
        if waited > 0.001:
            logger.info("the checkpoint of step %d waited %.3f s for the previous save to finish", step, waited)
        if self._commits:
            self.deliver(session, allow_stop=True)

    def deliver(self, session: Any, *, allow_stop: bool) -> None:
        """Hands the reported commits to the listeners and writes their CHECKPOINT session logs."""
        writer = session.summary_writer
        for manager, commit in self.take_commits():
            if writer is not None:
                writer.add_session_log("CHECKPOINT", commit.step, checkpoint_path=commit.path)
            creation = self.is_creation_commit(manager, commit)
            for listener in self.listeners_of(manager):
                if listener.after_save(session, commit.step) and allow_stop and not creation:
                    reason = (f"{type(listener).__name__}.after_save returned True after the "
                              f"checkpoint of step {commit.step}")
                    logger.info("%s", reason)
                    self.request_stop(reason)

    def flush(self, session: Any) -> None:
        """Waits for every save in flight to commit, then delivers the commits (at close: a
        listener's stop request has nothing left to stop). Raises a save's failure."""
        for manager in self._managers:
            manager.wait()
        self.deliver(session, allow_stop=False)


def _unique(items: list[Any]) -> list[Any]:
    seen: list[Any] = []
    for item in items:
        if all(s is not item for s in seen):
            seen.append(item)
    return seen


def describe(callable_or_obj: Callable[..., Any] | Any) -> str:
    """A short name for what requested something (a hook's class, a function's name)."""
    if isinstance(callable_or_obj, str):
        return callable_or_obj
    name = getattr(callable_or_obj, "__qualname__", None)
    return name if isinstance(name, str) else type(callable_or_obj).__name__
