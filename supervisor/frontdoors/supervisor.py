"""`Supervisor`: front door 1, time-based services in threads (SPEC §6).

Example::

    sv = Supervisor("runs/mnist", model=model, optimizer=opt,
                    hooks=[StopAtStepHook(last_step=10_000)], save_model_secs=300)
    with sv.managed_session() as s:
        while not s.should_stop():
            s.run(train_step, next(batches))

``managed_session()`` initialises or restores the training state from ``logdir``, starts the
checkpoint, summary and step-rate services, and on a clean end (loop finished, stop requested,
`StopIteration`, SIGTERM/SIGINT) writes a final checkpoint if the step changed. An exception
from the body or a service stops the services, joins them within ``stop_grace_secs`` and is
re-raised; no final checkpoint is written then, so the newest checkpoint on disk is always a
state the loop reached cleanly.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterable, Mapping

from supervisor import _validate as v
from supervisor._console import check_progress, progress_hooks
from supervisor._paths import locate_logdir
from supervisor.checkpoint import CheckpointManager, check_writable_directory
from supervisor.checkpoint.sharded import ShardedCheckpointManager
from supervisor.checkpoint.tiers.peers import make_sharded_manager
from supervisor.checkpoint.storage import Location
from supervisor.checkpoint.tiers.manager import make_manager
from supervisor.frontdoors.checkpoint_arguments import CheckpointOptions, check_checkpoint_options
from supervisor.clock import Clock
from supervisor.engine.coordinator import Coordinator, LooperThread
from supervisor.creators import (
    CheckpointSessionCreator,
    SessionCreator,
    ShardedSessionCreator,
    WorkerSessionCreator,
    check_session_fns,
)
from supervisor.distributed import default_is_chief
from supervisor.errors import RecoverableError
from supervisor.hook import Hook
from supervisor.frontdoors.services import SupervisorServices
from supervisor.engine.session import MonitoredSession, check_exception_types
from supervisor.state import TrainingState
from supervisor.sinks import prepare_sinks
from supervisor.summary import SummaryWriterCache

__all__ = ["Supervisor"]

_LOGDIR_HINT = " (None disables checkpoints and summaries)"


class Supervisor:
    """Initialise-or-recover, background checkpoints and summaries, one stop condition.

    Args:
        logdir: where checkpoints and TensorBoard events go; None disables both.
        model, optimizer: shorthands for the state entries ``"model"`` and ``"optimizer"``.
        state: more named stateful objects (schedulers, scalers, data loaders...).
        hooks: `supervisor.Hook` instances, called in list order.
        is_chief: whether this process writes; default: rank 0 of torch.distributed.
        init_fn, local_init_fn, ready_fn: see SPEC §4 (``fn(session)``).
        summary_fn: ``summary_fn(session) -> {tag: scalar}``, called by the summary service.
        save_model_secs: checkpoint interval; 0 disables the checkpoint service.
        save_summaries_secs: summary and step-rate interval; 0 disables both.
        checkpoint_basename: checkpoints are ``<logdir>/<basename>-<step>/``.
        max_to_keep, keep_checkpoint_every_n_hours: retention (SPEC §5.5).
        keep_best, best_metric, best_mode, keep_period: also keep the ``keep_best`` best checkpoints by
            ``best_metric`` ("min"/"max"), and forever those at multiples of ``keep_period`` (`supervisor.checkpoint.layout.best`).
        stop_grace_secs: how long service threads may take to stop.
        recovery_wait_secs: how often a non-chief polls for the chief's checkpoint.
        recoverable_exceptions: exception types that re-create the session from the latest
            checkpoint and retry (raised by a step, a hook, session creation, or reported by a
            service or `loop` thread), as `MonitoredSession` (SPEC §3.3).
        max_recoveries: how many recoveries in a row before the error is re-raised.
        save_mode: ``"async"`` (training pays only for the in-memory capture) or ``"sync"``.
        capture: ``"overlapped"`` (parameters and optimizer state copied while the next step
            runs; each optimizer's step waits for the copy), ``"blocking"``, or ``"auto"``
            (default: blocking; overlapped stays opt-in until its CUDA path has run on a GPU). SPEC §5.9.
        handle_signals: SIGTERM/SIGINT request a clean stop with a final checkpoint.
        trusted_globals: classes/functions a checkpoint may reference beyond what
            ``torch.load(weights_only=True)`` and NumPy's scalars/arrays need (SPEC §5.4).
        clock: injectable clock for tests.
        checkpoint_format: ``"torch"`` (one ``state.pt``, written by the chief), ``"dcp"``
            (``torch.distributed.checkpoint`` shards written by every rank; SPEC §12), or any other
            registered format the chief writes (``"safetensors"``: one pickle-free ``state.safetensors``;
            `supervisor.checkpoint.layout.format_registry`); checked at construction.
        max_wait_secs: how long a non-chief waits for the chief's restore decision.
        lock: how the writer keeps other writers out of ``logdir`` (SPEC §5.6, §16):
            ``"auto"`` (default: ``"flock"`` on a local path, ``"lease"`` on an object store),
            ``"flock"`` (an OS file lock) or ``"lease"`` (a lease file renewed every
            ``lease_secs / 3``; a dead writer's logdir is taken over only after it expired).
            On NFS and Lustre ``flock`` may be node-local (two nodes could both take it):
            use ``lock="lease"`` there.
        lease_secs: the lease's lifetime unrenewed (default 60 s). A writer that lost its lease
            fails its next save with `LeaseLostError`, before committing anything.
        storage_options: the object-store client's options when ``logdir`` is a URL
            (``s3://bucket/prefix``, SPEC §16), e.g. ``{"endpoint_url": ...}``; None (default)
            configures it the standard way (``AWS_*`` environment, ``~/.aws``, ``FSSPEC_S3_*``).
            Used by the checkpoint manager, its lease and the summary writer; on a non-chief
            (a rank of a process group, or ``is_chief=False`` alone), to read the chief's checkpoints.
        progress: ``"auto"`` (default): a tqdm bar on the chief instead of the periodic ``step N``
            line when stderr is a terminal, tqdm is installed and logging is not configured;
            True: the bar; False: the line (`supervisor._console`).
        summary_sinks: where the chief's scalars go besides TensorBoard, e.g.
            ``[supervisor.sinks.MLflowSink(experiment_name="x")]``; a stateful sink is checkpointed
            (an optional entry), so a resumed job continues the same MLflow run.
        local_dir, persist_every_steps, persist_every_secs, local_max_to_keep, persist_grace_secs:
            checkpoint tiers (SPEC §17) as `MonitoredTrainingSession`: saves go to the node-local
            ``local_dir``, one every K steps or T seconds (default 600 s) is copied to ``logdir``.
        peer_replicas: with ``checkpoint_format="dcp"`` and ``local_dir``, each rank also keeps a
            replica of a partner node's parts, so a lost node resumes from the local tiers (as
            `MonitoredTrainingSession`; default False).
    """

    def __init__(
        self, logdir: str | os.PathLike | None, model: Any = None, optimizer: Any = None, *,
        state: Mapping[str, Any] | None = None, hooks: Iterable[Any] = (), is_chief: bool | None = None,
        init_fn: Callable[[Any], Any] | None = None, local_init_fn: Callable[[Any], Any] | None = None,
        ready_fn: Callable[[Any], Any] | None = None, summary_fn: Callable[[Any], Mapping[str, Any]] | None = None,
        save_model_secs: float = 600, save_summaries_secs: float = 120, checkpoint_basename: str = "model.ckpt",
        max_to_keep: int | None = 5, keep_checkpoint_every_n_hours: float = 10000.0, stop_grace_secs: float = 120,
        recovery_wait_secs: float = 30, recoverable_exceptions: Any = (RecoverableError,), max_recoveries: int = 10,
        save_mode: str = "async", handle_signals: bool = True, trusted_globals: Iterable[Any] = (),
        clock: Clock | None = None, checkpoint_format: str = "torch", max_wait_secs: float = 7200, capture: str = "auto",
        lock: str = "auto", lease_secs: float | None = None, storage_options: Mapping[str, Any] | None = None,
        summary_sinks: Iterable[Any] = (), restore_step: int | str | os.PathLike | None = None, progress: Any = "auto",
        keep_best: int | None = None, best_metric: Any = None, best_mode: str = "min", keep_period: int | None = None,
        local_dir: str | os.PathLike | None = None, persist_every_steps: int | None = None,
        persist_every_secs: float | None = None, local_max_to_keep: int | None = 2, persist_grace_secs: float | None = 120.0,
        peer_replicas: bool = False) -> None:
        self._is_chief = default_is_chief(None if is_chief is None else v.check_bool("is_chief", is_chief))
        self._location = locate_logdir("logdir", logdir, writable=self._is_chief, hint=_LOGDIR_HINT,
                                       storage_options=storage_options)  # resolved once, here
        self._logdir = None if self._location is None else self._location.path
        self._sinks, state = prepare_sinks(summary_sinks, state, is_chief=self._is_chief, logdir=self._logdir,
                                           writes_summaries=save_summaries_secs)
        self._state = TrainingState.from_arguments(model=model, optimizer=optimizer, state=state)
        self._hooks, self._init_fns = v.check_hooks("hooks", hooks), check_session_fns(
            init_fn=init_fn, local_init_fn=local_init_fn, ready_fn=ready_fn)
        self._summary_fn = v.check_callable("summary_fn", summary_fn, signature="summary_fn(session) -> dict")
        self._save_model_secs = v.check_number("save_model_secs", save_model_secs, minimum=0)
        self._save_summaries_secs = v.check_number("save_summaries_secs", save_summaries_secs, minimum=0)
        self._checkpoint_options = check_checkpoint_options(
            basename=checkpoint_basename, max_to_keep=max_to_keep, keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
            save_mode=save_mode, trusted_globals=trusted_globals, capture=capture, lock=lock, lease_secs=lease_secs,
            logdir=self._location, restore_step=restore_step, keep_best=keep_best, best_metric=best_metric,
            best_mode=best_mode, keep_period=keep_period, local_dir=local_dir, persist_every_steps=persist_every_steps,
            persist_every_secs=persist_every_secs, local_max_to_keep=local_max_to_keep,
            persist_grace_secs=persist_grace_secs, checkpoint_format=checkpoint_format, peer_replicas=peer_replicas,
            clock=clock)
        self._stop_grace_secs = v.check_number("stop_grace_secs", stop_grace_secs, minimum=0)
        self._recovery_wait_secs = v.check_number("recovery_wait_secs", recovery_wait_secs, minimum=0)
        self._max_wait_secs = v.check_number("max_wait_secs", max_wait_secs, minimum=0)
        self._recoverable, self._max_recoveries = (check_exception_types(recoverable_exceptions),
                                                   v.check_int("max_recoveries", max_recoveries, minimum=0))
        self._handle_signals = v.check_bool("handle_signals", handle_signals)
        self._clock = self._checkpoint_options.clock  # resolved once, with the checkpoint options
        self._session: MonitoredSession | None = None
        self._coord, self._last_step, self._lock = Coordinator(), 0, threading.Lock()
        self._user_loops: list[tuple[float, Callable[..., Any], tuple, dict | None]] = []
        self._progress = check_progress(progress)

    # ---------------------------------------------------------------- the session
    def managed_session(self) -> _ManagedSession:
        """A context manager yielding the initialised or restored session (SPEC §3, §4)."""
        return _ManagedSession(self._open_session, self._session_closed)

    def _open_session(self) -> MonitoredSession:
        with self._lock:
            if self._session is not None:
                raise RuntimeError("this Supervisor already has an open managed_session(); "
                                   "close it before opening another")
            self._coord.clear_stop()
            creator = make_session_creator(
                self._state, self._location, is_chief=self._is_chief,
                checkpoint_options=self._checkpoint_options,
                summary_dir=self._location if self._is_chief and self._save_summaries_secs else None,
                max_wait_secs=self._max_wait_secs, recovery_wait_secs=self._recovery_wait_secs,
                summary_sinks=self._sinks, **self._init_fns)
            bar = progress_hooks(self._progress, is_chief=self._is_chief)
            services = SupervisorServices(save_model_secs=self._save_model_secs,
                                          save_summaries_secs=self._save_summaries_secs,
                                          summary_fn=self._summary_fn, clock=self._clock, progress_line=not bar)
            self._user_loops.clear()
            self._session = MonitoredSession(
                creator, [*bar, services, _RestartUserLoops(self._restart_user_loops), *self._hooks],
                stop_grace_secs=self._stop_grace_secs, recoverable_exceptions=self._recoverable,
                max_recoveries=self._max_recoveries, handle_signals=self._handle_signals,
                coord=self._coord, clock=self._clock)
            self._checkpoint_options = self._checkpoint_options.after_first_session()
            return self._session

    def _session_closed(self, last_step: int) -> None:
        with self._lock:
            self._session = None
            self._last_step = last_step

    def _restart_user_loops(self, coord: Coordinator) -> None:
        for interval_secs, target, args, kwargs in self._user_loops:
            LooperThread.loop(coord, interval_secs, target, args, kwargs, clock=self._clock)

    # ---------------------------------------------------------------- TF's Supervisor API
    @property
    def coord(self) -> Coordinator:
        return self._coord

    @property
    def is_chief(self) -> bool:
        return self._is_chief

    @property
    def logdir(self) -> str | None:
        return self._logdir

    @property
    def save_path(self) -> str | None:
        """The checkpoint path prefix, ``<logdir>/<checkpoint_basename>``, or None."""
        if self._logdir is None:
            return None
        return os.path.join(self._logdir, self._checkpoint_options.basename)

    @property
    def summary_writer(self) -> Any:
        """The open session's summary writer, or None (no session, non-chief, or disabled)."""
        return self._session.summary_writer if self._session is not None else None

    @property
    def global_step(self) -> int:
        """The open session's global step (the last session's once it closed; 0 before)."""
        return self._session.global_step if self._session is not None else self._last_step

    def request_stop(self, exc: BaseException | None = None) -> None:
        """Ends the open session (as `MonitoredSession.request_stop`) or the services; an
        ``exc`` is re-raised at close."""
        if self._session is not None:
            self._session.request_stop(exc)
        else:
            self._coord.request_stop(exc)

    def should_stop(self) -> bool:
        return self._coord.should_stop()

    def stop_on_exception(self) -> Any:
        return self._coord.stop_on_exception()

    def wait_for_stop(self, timeout: float | None = None) -> bool:
        return self._coord.wait_for_stop(timeout)

    def stop(self, threads: Iterable[threading.Thread] | None = None, ignore_live_threads: bool = False) -> None:
        """Requests a stop and joins the service and user threads (re-raising a thread's error)."""
        self._coord.request_stop()
        self._coord.join(threads, stop_grace_secs=self._stop_grace_secs, ignore_live_threads=ignore_live_threads)

    def loop(self, interval_secs: float, target: Callable[..., Any], args: Iterable[Any] = (),
             kwargs: dict | None = None) -> LooperThread:
        """Starts a user service: ``target(*args, **kwargs)`` every ``interval_secs`` on this
        supervisor's coordinator (joined when the session closes). Started inside a
        ``managed_session()``, it is started again after a recovery re-creates the session."""
        thread = LooperThread.loop(self._coord, interval_secs, target, args, kwargs, clock=self._clock)
        if self._session is not None:
            self._user_loops.append((interval_secs, target, tuple(args), kwargs))
        return thread

    def summary_computed(self, summaries: Mapping[str, Any], global_step: int | None = None) -> None:
        """Appends user scalars ``{tag: value}`` to the session's events file."""
        writer = self.summary_writer
        if writer is None:
            raise RuntimeError("writing a summary requires a summary writer: the Supervisor needs a "
                               "logdir, save_summaries_secs > 0, an open managed_session(), and to be chief")
        if not isinstance(summaries, Mapping):
            raise TypeError(f"summaries must be a dict of tag -> scalar, got {summaries!r}")
        writer.add_scalars(dict(summaries), self.global_step if global_step is None else global_step)


class _RestartUserLoops(Hook):
    """Starts the `Supervisor.loop` threads again after a recovery (the first creation has none)."""

    def __init__(self, restart: Callable[[Coordinator], None]) -> None:
        self._restart = restart

    def after_create_session(self, session: Any, coord: Coordinator) -> None:
        self._restart(coord)  # none at the first creation: loops start inside the session


class _ManagedSession:
    """The context manager behind `Supervisor.managed_session`."""

    def __init__(self, open_session: Callable[[], MonitoredSession],
                 session_closed: Callable[[int], None]) -> None:
        self._open_session, self._session_closed = open_session, session_closed
        self._session: MonitoredSession | None = None

    def __enter__(self) -> MonitoredSession:
        self._session = self._open_session()
        return self._session

    def __getattr__(self, name: str) -> Any:
        # `sv.managed_session().run(...)`: the session exists only inside a `with` block.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"managed_session() returns a context manager, not the session: it has no "
                             f"{name!r}. Use it in a with block: `with sv.managed_session() as s: "
                             f"s.{name}(...)`")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        session = self._session
        try:
            return session.__exit__(exc_type, exc, tb)
        finally:
            self._session_closed(session.global_step)


def make_session_creator(state: TrainingState, checkpoint_dir: Location | None, *, is_chief: bool,
                         checkpoint_options: CheckpointOptions, summary_dir: Location | None,
                         max_wait_secs: float, recovery_wait_secs: float,
                         summary_sinks: list[Any] | None = None, **init_fns: Any) -> SessionCreator:
    """The creator a front door needs: restore-or-init from ``checkpoint_dir`` on the chief (taking the
    ownership lock), wait-and-restore on workers, in memory without a directory. The checkpoints'
    format is ``checkpoint_options.checkpoint_format``: with ``"dcp"`` sharded checkpoints every
    rank takes part in (§12), with any other the chief's `CheckpointManager` writes it. The
    directories come resolved (their `Location`: path and storage, made once by the front door),
    and each manager, writer and creator uses that storage (a worker's too: it reads the chief's
    checkpoints); ``checkpoint_options.restore_step`` goes to the chief (sharded: to every rank)."""
    options, writer = checkpoint_options, None
    if options.sharded:
        options.check_sharded()
    if is_chief:  # a read-only or foreign logdir: a clear error before any thread starts
        _check_writable(checkpoint_dir=checkpoint_dir, summary_dir=summary_dir)
    if summary_dir is not None and is_chief:
        writer = SummaryWriterCache.acquire(summary_dir)
    if checkpoint_dir is None:
        creator: SessionCreator = SessionCreator(state, is_chief=is_chief, summary_writer=writer, **init_fns)
    elif options.sharded:  # every rank has a manager: each writes its shards (§12)
        creator = ShardedSessionCreator(state, _sharded_manager(checkpoint_dir, options, max_wait_secs),
                                        is_chief=is_chief, logdir=checkpoint_dir.path, summary_writer=writer,
                                        restore_step=options.restore_step, **init_fns)
    elif is_chief:
        creator = CheckpointSessionCreator(state, _manager(checkpoint_dir, options), logdir=checkpoint_dir.path,
                                           summary_writer=writer, restore_step=options.restore_step, **init_fns)
    else:
        # A worker knows the chief's logdir read-only: it never writes there and takes no lock.
        # Its storage is the chief's location's (the same storage_options): a job configured
        # through them alone restores on every rank.
        creator = WorkerSessionCreator(state, checkpoint_dir, max_wait_secs=max_wait_secs,
                                       recovery_wait_secs=recovery_wait_secs, clock=options.clock, logdir=checkpoint_dir.path,
                                       trusted_globals=options.trusted_globals, **init_fns)
    creator.environment.owns_summary_writer = writer is not None
    _attach_sinks(creator, writer, summary_sinks or [])
    return creator


def _manager(location: Location, o: CheckpointOptions) -> Any:
    """The chief's `CheckpointManager` (a `TieredCheckpointManager` with ``o.local_dir``)."""
    return make_manager(
        location, local_dir=o.local_dir, persist_every_steps=o.persist_every_steps,
        persist_every_secs=o.persist_every_secs, local_max_to_keep=o.local_max_to_keep,
        persist_grace_secs=o.persist_grace_secs, basename=o.basename, max_to_keep=o.max_to_keep,
        keep_checkpoint_every_n_hours=o.keep_checkpoint_every_n_hours, save_mode=o.save_mode,
        trusted_globals=o.trusted_globals, capture=o.capture, lock=o.lock, lease_secs=o.lease_secs,
        keep_best=o.keep_best, best_metric=o.best_metric, best_mode=o.best_mode, keep_period=o.keep_period, clock=o.clock,
        checkpoint_format=o.checkpoint_format)


def _sharded_manager(location: Location, o: CheckpointOptions, max_wait_secs: float) -> ShardedCheckpointManager:
    """Every rank's `ShardedCheckpointManager` (`CheckpointOptions.check_sharded` passed; a
    `ShardedTieredCheckpointManager` with ``o.local_dir``)."""
    return make_sharded_manager(
        location, local_dir=o.local_dir, persist_every_steps=o.persist_every_steps,
        persist_every_secs=o.persist_every_secs, local_max_to_keep=o.local_max_to_keep,
        persist_grace_secs=o.persist_grace_secs, basename=o.basename, max_to_keep=o.max_to_keep, keep_checkpoint_every_n_hours=o.keep_checkpoint_every_n_hours,
        save_mode=o.save_mode, trusted_globals=o.trusted_globals, max_wait_secs=max_wait_secs, clock=o.clock,
        capture=o.capture, lock=o.lock, lease_secs=o.lease_secs, peer_replicas=o.peer_replicas)


def _check_writable(**directories: str | None) -> None:
    for argument, directory in directories.items():
        if directory is not None:
            check_writable_directory(directory, argument=argument)


def _attach_sinks(creator: SessionCreator, writer: Any, sinks: list[Any]) -> None:
    """The sinks get the writer's scalars; the session's environment closes them at the end."""
    if writer is not None and sinks:
        for sink in sinks:
            writer.add_sink(sink)
        creator.environment.sinks = list(sinks)
