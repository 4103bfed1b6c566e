"""The session-run hook protocol (SPEC §3.2): `Hook`, `RunArgs`, `RunContext`, `RunValues`,
`StepContext`, and `IdleUntil` (a hook's public schedule, so the session skips it when idle).

A hook is called at fixed points of a `MonitoredSession`'s life. Every method of `Hook` is a
no-op, so a hook overrides only what it needs, and a method a hook does not override is never
called (it costs nothing on that path). The whole call order, as pseudocode::

    for h in hooks: h.begin()
    create the session (initialise or restore the training state)     # a RecoverableError here:
    for h in hooks: h.after_create_session(session, coord)            #   back off, create again
    while not should_stop():
        for h in hooks: args_h = h.before_run(run_context)      # may ask for fetches / feeds
        try:
            result = step_fn(*args, **kwargs, **all_feeds)
        except RecoverableError:
            re-create the session from the latest checkpoint
            for h in hooks: h.after_create_session(session, coord)
            retry the same run from before_run
        global_step += 1
        for h in hooks: h.after_run(run_context, RunValues(results=<fetches of args_h>))
        step boundary (SPEC §3.5) — hooks, threads and signals only *requested* until here:
            deliver committed checkpoints: listener.after_save(session, step)  # True: stop
            decision = agreement.decide(step, requests)     # the identity on one process
            if decision.save: capture a checkpoint          # holds every after_run of this step
            if decision.stop: capture the final checkpoint; should_stop() becomes True
    on a clean close (normal exit, stop requested, StopIteration):
        the last boundary (final checkpoint if the step changed), join threads,
        wait for the saves in flight and deliver their commits
        for h in hooks: h.end(session)
    on a close caused by an exception:
        for h in hooks: h.on_exception(session, exc)            # cleanup only; no final checkpoint

All hook calls go in list order. A hook that acts only from time to time declares when it is
idle (`Hook.idle_until`): the session then skips its ``before_run``/``after_run`` until then.

Example: a user hook that stops training once the learning rate falls below a floor::

    class StopAtLowLR(supervisor.Hook):
        def __init__(self, optimizer, floor):
            self.optimizer, self.floor = optimizer, floor

        def after_run(self, run_context, run_values):
            if self.optimizer.param_groups[0]["lr"] < self.floor:
                run_context.request_stop()
"""
from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

__all__ = ["Hook", "IdleUntil", "RunArgs", "RunContext", "RunValues", "StepCall", "StepContext", "check_fetch_structure",
           "check_named_fetches", "check_run_args", "declares_schedule", "overrides", "resolve_fetches",
           "warn_misspelled_methods"]

logger = logging.getLogger(__name__)


class Hook:
    """Base class of session-run hooks; override the methods you need (all are no-ops)."""

    def begin(self) -> None:
        """Called once, before the session is created. Hooks may not use the session here."""

    def after_create_session(self, session: Any, coord: Any) -> None:
        """Called after every session creation, including re-creation after a recoverable
        error. The training state is initialised or restored at this point."""

    def before_run(self, run_context: RunContext) -> RunArgs | None:
        """Called before each step; return `RunArgs` to ask for fetches or add feeds."""
        return None

    def after_run(self, run_context: RunContext, run_values: RunValues) -> None:
        """Called after each successful step; ``run_values.results`` mirrors the fetches this
        hook asked for in ``before_run`` (``None`` if it asked for nothing)."""

    def end(self, session: Any) -> None:
        """Called once on a clean close: normal exit, stop requested, or `StopIteration`."""

    def on_exception(self, session: Any, exc: BaseException) -> None:
        """Called once when the session closes because of an exception. Release resources
        here; the training state may be mid-step."""

    def idle_until(self) -> IdleUntil | None:
        """The schedule of a hook that acts only from time to time (a step or time interval):
        until when the session may skip its ``before_run``/``after_run``, or None (call them at
        the next step). Asked after each step on which the hook was called.

        Only a class that defines both ``idle_until`` and its ``before_run``/``after_run`` (or
        inherits them from `Hook`) is skipped: a subclass that overrides ``after_run`` alone is
        called on every step. Calling a hook more often than it declares is always correct.
        """
        return None


@dataclass(frozen=True)
class IdleUntil:
    """What `Hook.idle_until` returns: the hook has nothing to do before the step about to be
    taken reaches ``step``, or before ``clock()`` (a monotonic clock) reaches ``time``."""

    step: int | None = None
    time: float = 0.0
    clock: Callable[[], float] | None = None

    @classmethod
    def step_reaches(cls, step: int) -> IdleUntil:
        return cls(step=step)

    @classmethod
    def clock_reaches(cls, clock: Callable[[], float], time: float) -> IdleUntil:
        return cls(time=time, clock=clock)


def overrides(hook: Hook, method: str) -> bool:
    """Whether ``hook``'s class overrides `Hook`'s no-op ``method``."""
    return getattr(type(hook), method, None) is not getattr(Hook, method)


def declares_schedule(hook: Hook) -> bool:
    """Whether the session may skip ``hook``'s ``before_run``/``after_run`` on the steps its
    `Hook.idle_until` rules out: its class declares a schedule, and the methods it runs per step
    are those of the class that declares it (or `Hook`'s no-ops)."""
    def owner(name: str) -> type | None:
        return next((c for c in type(hook).__mro__ if name in c.__dict__), None)

    schedule = owner("idle_until")
    if schedule is Hook or schedule is None:
        return False
    return all(owner(name) in (schedule, Hook) for name in ("before_run", "after_run"))


@dataclass(frozen=True)
class RunArgs:
    """What a hook wants from the coming step.

    Args:
        fetches: what to hand back in ``run_values.results``: a key of the step function's
            returned dict, a zero-argument callable evaluated after the step, or a
            list/tuple/dict of those (the results mirror the structure). Objects come back
            as they are: a tensor stays a tensor (no forced ``.item()``).
        feeds: extra keyword arguments for the step function, e.g. ``{"summarize": True}``.
    """

    fetches: Any = None
    feeds: Mapping[str, Any] | None = None


class StepCall(NamedTuple):
    """The call a `MonitoredSession.run` was asked to make (``run_context.original_args``)."""

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict


class RunContext:
    """What a hook sees of the current step: the original call, the session, and a stop switch."""

    __slots__ = ("_fn", "_args", "_kwargs", "session", "stop_requested", "_stop_on_every_rank")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, session: Any) -> None:
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self.session = session
        #: Whether a hook called `request_stop` during this step (read by the session after
        #: each ``after_run``: a plain attribute, as cheap to read as the step path needs).
        self.stop_requested = False
        self._stop_on_every_rank = False

    @property
    def original_args(self) -> StepCall:
        """The step function and the arguments the caller passed to ``run``."""
        return StepCall(self._fn, self._args, self._kwargs)

    def request_stop(self, *, on_every_rank: bool = False) -> None:
        """Ends training after this step: ``session.should_stop()`` becomes True at this step's
        boundary. ``on_every_rank=True`` says every rank of a distributed job requests it at this
        same step (e.g. a step count), so the ranks' agreement applies it without a round trip."""
        self.stop_requested = True
        self._stop_on_every_rank = on_every_rank

    @property
    def stop_on_every_rank(self) -> bool:
        """Whether the stop requested is one every rank requests at this same step."""
        return self._stop_on_every_rank


class StepContext:
    """What ``run_step_fn``'s ``step_fn(step_context)`` receives (TF's ``StepContext``)."""

    __slots__ = ("session",)

    def __init__(self, session: Any) -> None:
        self.session = session

    def run_with_hooks(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One step through the hooks: ``session.run(fn, *args, **kwargs)``."""
        return self.session.run(fn, *args, **kwargs)

    def request_stop(self) -> None:
        """Ends the session cleanly at once: raises `StopIteration`, which the ``with`` swallows
        after running ``end`` hooks. No per-step hook runs for the rest of this step."""
        self.session.boundary.request_stop("step_fn requested stop")
        raise StopIteration("step_fn has requested the iterations to stop")


class RunValues(NamedTuple):
    """The results of one step for one hook: ``results`` mirrors the hook's `RunArgs.fetches`."""

    results: Any = None


# A step function that returns a single value rather than a dict (the common ``return loss``)
# exposes it to fetches under this key, so e.g. NanTensorHook() and the summary service work.
SINGLE_OUTPUT_KEY = "loss"


def resolve_fetches(fetches: Any, output: Any, hook: Hook | None = None) -> Any:
    """Resolves a hook's fetches against one step's ``output`` (see `RunArgs`)."""
    if fetches is None:
        return None
    if isinstance(fetches, str):
        return _fetch_key(fetches, output, hook)
    if callable(fetches):
        return fetches()
    if isinstance(fetches, Mapping):
        return {k: resolve_fetches(v, output, hook) for k, v in fetches.items()}
    if isinstance(fetches, (list, tuple)):
        values = [resolve_fetches(f, output, hook) for f in fetches]
        return values if isinstance(fetches, list) else tuple(values)
    raise TypeError(
        f"{_who(hook)} asked for fetches={fetches!r}; a fetch must be a key of the step "
        "function's returned dict, a zero-argument callable, or a list/tuple/dict of those"
    )


def _fetch_key(key: str, output: Any, hook: Hook | None) -> Any:
    if isinstance(output, Mapping):
        try:
            return output[key]
        except KeyError:
            raise KeyError(
                f"{_who(hook)} fetched {key!r} but the step function's result has only the keys "
                f"{sorted(map(str, output))}; return it in the dict, e.g. {{{key!r}: ...}}"
            ) from None
    if output is not None and key == SINGLE_OUTPUT_KEY:
        return output
    raise KeyError(
        f"{_who(hook)} fetched {key!r} but the step function returned "
        f"{type(output).__name__}, not a dict; return a dict such as {{{key!r}: value}}"
    )


def _who(hook: Hook | None) -> str:
    return type(hook).__name__ if hook is not None else "a hook"


# ---------------------------------------------------------------- fetch arguments of hooks
def check_fetch_structure(name: str, fetches: Any) -> None:
    """Validates a fetch structure as `resolve_fetches` takes it: an output key, a zero-argument
    callable, or a non-empty list/tuple/dict of those (nested)."""
    if isinstance(fetches, str) or callable(fetches):
        return
    if isinstance(fetches, Mapping):
        children = list(fetches.values())
    elif isinstance(fetches, (list, tuple)):
        children = list(fetches)
    else:
        raise TypeError(f"{name} must be a zero-argument callable, an output key, or a list/tuple/dict of those, "
                        f"got {fetches!r}")
    if not children:
        raise ValueError(f"{name} is empty: there is nothing to evaluate")
    for child in children:
        check_fetch_structure(name, child)


def check_named_fetches(name: str, fetches: Any, *, keys_only: bool = False, wrap_string: bool = True,
                        empty: str | None = None, also: str = "") -> dict[str, Any]:
    """Validates the named fetches a hook takes (e.g. ``SummarySaverHook(fetches=...)``) and
    returns them as ``{tag: fetch}`` in the given order.

    Accepted: a list/tuple of output keys (each its own tag); unless ``keys_only``, a dict
    ``{tag: key_or_zero_argument_callable}``; a single key string (wrapped in a list if
    ``wrap_string``, else refused with the fix). ``empty``: the message of the `ValueError` for
    no fetches (None: allowed). ``also``: other accepted values, for the message.
    """
    kinds = f"{also}a list of output keys{'' if keys_only else ' or a dict {tag: key_or_callable}'}"
    if isinstance(fetches, str):
        if not wrap_string:
            raise TypeError(f"{name} must be {kinds}, got the string {fetches!r}; write [{fetches!r}]")
        fetches = [fetches]
    if isinstance(fetches, Mapping) and not keys_only:
        tags = dict(fetches)
    elif isinstance(fetches, (list, tuple)):
        for fetch in fetches:
            if not isinstance(fetch, str) or not fetch:
                fix = "" if keys_only else "; use a dict {tag: key_or_callable} to name a callable"
                raise TypeError(f"{name}: a list entry must be an output key (a non-empty str), got {fetch!r}{fix}")
        tags = {fetch: fetch for fetch in fetches}
    else:
        raise TypeError(f"{name} must be {kinds}, got {fetches!r}")
    if not tags and empty is not None:
        raise ValueError(empty)
    for tag, fetch in tags.items():
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"{name}: every tag must be a non-empty string, got {tag!r}")
        if not ((isinstance(fetch, str) and fetch) or callable(fetch)):
            raise TypeError(f"{name}[{tag!r}] must be an output key (str) or a zero-argument callable, got {fetch!r}")
    return tags


# ---------------------------------------------------------------- mistakes in user hooks
_HOOK_METHODS = ("begin", "after_create_session", "before_run", "after_run", "end", "on_exception")
_warned_classes: set[type] = set()


def warn_misspelled_methods(hooks: Any) -> None:
    """Logs a WARNING, once per class, for each method of a hook class whose name is close to a
    hook method's but is not one (``after_runs``, ``beforeRun``): it would never be called."""
    for hook in hooks:
        cls = type(hook)
        if cls in _warned_classes:
            continue
        _warned_classes.add(cls)
        for klass in cls.__mro__:
            if klass is Hook or klass is object or not issubclass(klass, Hook):
                continue
            for name, member in vars(klass).items():
                if name.startswith("_") or name in _HOOK_METHODS or not callable(member):
                    continue
                close = difflib.get_close_matches(name.lower(), _HOOK_METHODS, n=1, cutoff=0.85)
                if close:
                    logger.warning("%s defines %s(), which is not a hook method and is never called by the "
                                   "session; did you mean %s()?", cls.__name__, name, close[0])


def check_run_args(hook: Hook, value: Any) -> RunArgs:
    """What ``hook.before_run`` returned, if it is a `RunArgs`; else a `TypeError` saying so."""
    if isinstance(value, RunArgs):
        return value
    raise TypeError(f"{type(hook).__name__}.before_run returned {type(value).__name__} {value!r}; it must return "
                    "None or supervisor.RunArgs(fetches=..., feeds=...), e.g. RunArgs(fetches=['loss'])")
