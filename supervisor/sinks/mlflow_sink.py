"""`MLflowSink`: a session's scalars logged to an MLflow run, continued across resumes.

``pip install "torch-supervisor[mlflow]"`` (MLflow's client, ``mlflow-skinny``). The run's id is
kept in every checkpoint (the sink is an optional entry of the training state, see
`supervisor.sinks`), so a resumed or requeued job logs into the same run instead of starting a
new one — whichever process resumes it, on whichever host.

Decisions:
- The run is created at the first checkpoint or the first flush, whichever comes first — after
  the restore, so a resume never creates a run it then abandons.
- Scalars are queued on the training thread and sent with ``log_batch`` (up to 1,000 points a
  request) by the sink's own thread every ``flush_secs``, whenever the summary writer flushes,
  and before each checkpoint commits (on the checkpoint's writer thread, with the events file:
  `SummaryWriter.sync_point`), so the points of the steps up to a checkpoint are in MLflow
  before the checkpoint exists, and training never waits for MLflow.
- A failed send (the tracking server away) keeps the points for the next flush with a WARNING;
  the queue is bounded (``max_queue`` points: the oldest are dropped, counted in a WARNING).
  MLflow is a copy: it never fails or stalls training; TensorBoard's events file is the record.
- A clean close marks the run ``FINISHED``; a resume marks it ``RUNNING`` again. A killed run
  stays ``RUNNING`` (MLflow has no way to know), and the points it logged after its last
  checkpoint stay in the run: the resumed job logs those steps again, as with TensorBoard
  before it hides them (MLflow plots both; their timestamps tell them apart).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Mapping

from supervisor._validate import check_int, check_number

__all__ = ["MLflowSink"]

logger = logging.getLogger(__name__)

_BATCH = 1000  # MLflow's limit of metrics per log_batch


class MLflowSink:
    """Sends a session's scalars to an MLflow run (see the module).

    Args:
        experiment_name: the experiment the run belongs to (created if missing); None: MLflow's
            default experiment.
        run_name: the name of a newly created run.
        tracking_uri: where MLflow stores runs (``file:///path``, ``sqlite:///mlflow.db``,
            ``http://server:5000``); None: MLflow's own choice (``MLFLOW_TRACKING_URI``).
        tags: tags of a newly created run.
        run_id: log into this existing run (a checkpoint's run id still wins on resume).
        flush_secs: the longest time points wait before they are sent.
        max_queue: the most points kept while the tracking server cannot be reached.
        state_name: the training-state entry that keeps the run id in checkpoints.

    Example::

        sink = MLflowSink(experiment_name="lstm", tracking_uri="sqlite:///mlflow.db")
        with MonitoredTrainingSession("runs/lstm", model=model, optimizer=opt, summary_sinks=[sink]) as s:
            ...
        sink.run_id     # the run, the same after every resume
    """

    optional_entry = True  # see supervisor.state: checkpoints with and without it restore

    def __init__(self, experiment_name: str | None = None, *, run_name: str | None = None,
                 tracking_uri: str | None = None, tags: Mapping[str, str] | None = None, run_id: str | None = None,
                 flush_secs: float = 30, max_queue: int = 1_000_000, state_name: str = "mlflow") -> None:
        for name, value in (("experiment_name", experiment_name), ("run_name", run_name),
                            ("tracking_uri", tracking_uri), ("run_id", run_id)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"MLflowSink's {name} must be a non-empty string or None, got {value!r}")
        if tags is not None and not (isinstance(tags, Mapping) and all(isinstance(k, str) for k in tags)):
            raise TypeError(f"MLflowSink's tags must be a dict of str -> str, got {tags!r}")
        if not isinstance(state_name, str) or not state_name or "/" in state_name:
            raise ValueError(f"MLflowSink's state_name must be a non-empty name without '/', got {state_name!r}")
        self.experiment_name, self.run_name, self.tracking_uri = experiment_name, run_name, tracking_uri
        self.tags = {k: str(v) for k, v in (tags or {}).items()}
        self.flush_secs = check_number("flush_secs", flush_secs, strictly_positive=True)
        self.max_queue = check_int("max_queue", max_queue, minimum=1)
        self.state_name = state_name
        self.run_id: str | None = run_id
        self._client: Any = None
        self._lock = threading.Lock()          # the queue and the counters
        self._send_lock = threading.Lock()     # one sender at a time (the thread or a flush)
        self._queue: list[tuple[str, float, int, int]] = []
        self._dropped = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._resumed = False

    # -- the sink interface (supervisor.sinks.ScalarSink) --------------------------------------
    def write(self, step: int, scalars: Mapping[str, float], wall_time: float) -> None:
        stamp = int(wall_time * 1000)
        with self._lock:
            if self._closed:
                return
            self._queue.extend((tag, float(value), stamp, step) for tag, value in scalars.items())
            over = len(self._queue) - self.max_queue
            if over > 0:
                del self._queue[:over]
                self._dropped += over
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="supervisor-mlflow-sink", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        self._send()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=self.flush_secs + 60)
        self._send()
        if self.run_id is not None:
            self._call("marking the run FINISHED", lambda c: c.set_terminated(self.run_id, "FINISHED"))

    # -- checkpointed with the training state ------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run id (the run is created here if no scalar was sent yet; if MLflow cannot be
        reached, the checkpoint holds no run id and the next one will). Called when a checkpoint
        is captured; the points of its steps are sent by the checkpoint's writer thread before it
        commits (the summary writer's sync point flushes the sinks with the events file)."""
        try:
            self._ensure_run()
        except Exception as e:  # noqa: BLE001 - a checkpoint never fails for MLflow
            logger.warning("MLflow: could not create or resume the run (%s); this checkpoint records no run id", e)
        return {"run_id": self.run_id, "__optional_entry__": True}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        run_id = state_dict.get("run_id")
        if isinstance(run_id, str) and run_id:
            self.run_id = run_id
            self._resumed = True

    # -- internals ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wake.wait(self.flush_secs)
            self._wake.clear()
            with self._lock:
                if self._closed:
                    return
            self._send()

    def _client_or_none(self) -> Any:
        if self._client is None:
            try:
                from mlflow.tracking import MlflowClient
            except ImportError as e:
                raise ImportError('MLflowSink needs MLflow\'s client: pip install "torch-supervisor[mlflow]" '
                                  "(or mlflow-skinny, or mlflow)") from e
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _ensure_run(self) -> None:
        with self._send_lock:
            if self.run_id is not None:
                if self._resumed:
                    self._resumed = False
                    self._call("marking the resumed run RUNNING",
                               lambda c: c.update_run(self.run_id, status="RUNNING"))
                    logger.info("MLflow: continuing run %s", self.run_id)
                return
            client = self._client_or_none()
            experiment_id = "0"
            if self.experiment_name is not None:
                found = client.get_experiment_by_name(self.experiment_name)
                experiment_id = found.experiment_id if found is not None else client.create_experiment(
                    self.experiment_name)
            run = client.create_run(experiment_id, run_name=self.run_name, tags=self.tags)
            self.run_id = run.info.run_id
            logger.info("MLflow: logging to run %s (experiment %s)", self.run_id, self.experiment_name or "Default")

    def _send(self) -> None:
        with self._lock:
            if not self._queue and not self._dropped:
                return
        try:
            self._ensure_run()
        except Exception as e:  # noqa: BLE001 - a copy never stops training; the points stay queued
            logger.warning("MLflow: could not create or resume the run (%s); the points stay queued", e)
            return
        with self._send_lock:
            with self._lock:
                points, self._queue = self._queue, []
                dropped, self._dropped = self._dropped, 0
            if dropped:
                logger.warning("MLflow: %d points were dropped: more than max_queue=%d waited for the tracking "
                               "server", dropped, self.max_queue)
            from mlflow.entities import Metric
            for start in range(0, len(points), _BATCH):
                chunk = points[start:start + _BATCH]
                metrics = [Metric(tag, value, stamp, step) for tag, value, stamp, step in chunk]
                if not self._call(f"logging {len(chunk)} points", lambda c: c.log_batch(self.run_id, metrics=metrics)):
                    with self._lock:  # kept, in order, before what came meanwhile
                        self._queue[:0] = points[start:]
                    return

    def _call(self, what: str, fn: Any) -> bool:
        try:
            fn(self._client_or_none())
            return True
        except Exception as e:  # noqa: BLE001 - see the module: MLflow never fails training
            logger.warning("MLflow: %s for run %s failed (%s: %s); retried at the next flush", what, self.run_id,
                           type(e).__name__, e)
            return False

    def __repr__(self) -> str:
        return f"MLflowSink(experiment_name={self.experiment_name!r}, run_id={self.run_id!r})"

