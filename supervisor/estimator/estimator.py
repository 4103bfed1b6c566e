"""`Estimator`: TF's train / evaluate / predict / export workflow on the runtime (SPEC §10.1).

Training runs on `MonitoredTrainingSession` with TF's hook assembly. Evaluation, prediction and
export never touch the live model: they load a checkpoint into a separate copy of it (made once
with ``copy.deepcopy`` and reloaded for every checkpoint), in eval mode under ``torch.no_grad()``,
and save and restore the process's RNG states around the work, so training that evaluates in
between ends bit-identical to training that does not.

Example::

    est = Estimator("runs/exp", model=net, optimizer=opt, train_step=train_step,
                    eval_step=lambda m, b: {"loss": F.cross_entropy(m(b[0]), b[1])},
                    config=RunConfig("runs/exp", save_checkpoints_steps=500))
    est.train(train_input_fn, max_steps=2_000)
    est.evaluate(eval_input_fn, steps=50)    # {"loss": 0.41, "global_step": 2000}
"""
from __future__ import annotations

import copy
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

import torch

from supervisor import _validate as v
from supervisor.checkpoint import (
    STEP_KEY,
    CheckpointRead,
    latest_checkpoint,
    read_checkpoint,
    read_manifest,
)
from supervisor.checkpoint.storage import Location, relocate, resolve_location
from supervisor.clock import Clock, resolve_clock
from supervisor.errors import CheckpointNotFoundError
from supervisor.estimator.export.writer import write_export
from supervisor.estimator.inputs import END, INPUT_ENTRY, TrainingInput, call_input_fn, log_input_end
from supervisor.estimator.isolation import preserved_rng
from supervisor.estimator.locations import is_url, options_for
from supervisor.estimator.metrics import EvalEventsFile, check_metric_objects
from supervisor.estimator.run_config import RunConfig, resolve_config
from supervisor.estimator.session_factory import training_session
from supervisor.estimator.sidecar import eval_dir_for, evaluate_batches, model_entry
from supervisor.estimator.specs import (
    validate_eval_name,
    validate_hooks,
    validate_input_fn,
    validate_saving_listeners,
)
from supervisor.estimator.variables import variable_names, variable_value
from supervisor.estimator.warm_start import WarmStartSettings, check_warm_start, warm_start_fn
from supervisor.state import TrainingState, strip_wrapper_prefixes, unwrap_module

__all__ = ["Estimator", "preserved_rng"]

logger = logging.getLogger(__name__)


class Estimator:
    """Trains, evaluates, predicts and exports one model in ``model_dir``.

    Args:
        model_dir: the log directory (or None to take ``config.model_dir``).
        model: the ``torch.nn.Module`` trained; evaluation uses a copy of it.
        optimizer, state: more training state (see `MonitoredTrainingSession`).
        train_step: ``train_step(batch) -> {"loss": ..., ...}`` on the live model it closes over.
        eval_step: ``eval_step(model, batch) -> {name: scalar}`` on the evaluation copy
            (None: ``model(batch)`` returns a scalar loss or a dict of scalars).
        predict_step: ``predict_step(model, batch) -> tensor | dict`` (None: ``model(batch)``).
        metrics: ``{name: obj}`` with ``update(outputs, batch)``, ``compute()``, ``reset()``; a
            ``compute()`` returning a dict gives ``name/key`` metrics.
        example_input: a tensor or tuple of positional arguments; exports then include a
            ``torch.export`` program.
        config: a `RunConfig` (default: ``RunConfig(model_dir)``); an object-store ``model_dir``
            takes its client options there (``RunConfig(model_dir, storage_options=...)``).
        clock: injectable clock (throttling, export timestamps, the training session).
        warm_start_from: a checkpoint, log directory or URL, or `WarmStartSettings`: the model
            starts from its weights when ``model_dir`` holds no checkpoint yet
            (`supervisor.estimator.warm_start`).
    """

    def __init__(self, model_dir: str | os.PathLike | None = None, *, model: torch.nn.Module,
                 optimizer: Any = None, state: Mapping[str, Any] | None = None,
                 train_step: Callable[[Any], Any] | None = None,
                 eval_step: Callable[[torch.nn.Module, Any], Any] | None = None,
                 predict_step: Callable[[torch.nn.Module, Any], Any] | None = None,
                 metrics: Mapping[str, Any] | None = None, example_input: Any = None,
                 config: RunConfig | None = None, clock: Clock | None = None,
                 warm_start_from: str | os.PathLike | WarmStartSettings | None = None) -> None:
        self._config = resolve_config(model_dir, config)
        if not isinstance(unwrap_module(model), torch.nn.Module) and not isinstance(model, torch.optim.Optimizer):
            raise TypeError(f"model must be a torch.nn.Module, got {model!r}")
        TrainingState.from_arguments(model=model, optimizer=optimizer, state=state)  # validates; names a mix-up
        self._model, self._optimizer, self._state = model, optimizer, state
        self._train_step = v.check_callable("train_step", train_step, signature="train_step(batch) -> dict")
        self._eval_step = v.check_callable("eval_step", eval_step, signature="eval_step(model, batch) -> dict")
        self._predict_step = v.check_callable("predict_step", predict_step,
                                              signature="predict_step(model, batch) -> tensor | dict")
        self._metrics = check_metric_objects(metrics)
        if example_input is not None and not isinstance(example_input, (torch.Tensor, tuple)):
            raise TypeError(f"example_input must be a tensor or a tuple of positional arguments, got "
                            f"{type(example_input).__name__}")
        self.example_input = example_input
        self._clock = resolve_clock(clock)
        self._warm_start = check_warm_start(warm_start_from)
        self._eval_copy: torch.nn.Module | None = None
        self._copy_holds: str | None = None  # the checkpoint whose weights the copy holds
        self._copy_step = 0
        self._event_files: dict[str, EvalEventsFile] = {}
        self._input: TrainingInput | None = None  # the last train() call's input (its live pass)

    # ------------------------------------------------------------------ properties
    @property
    def config(self) -> RunConfig:
        return self._config

    @property
    def model_dir(self) -> str:
        return self._config.model_dir

    @property
    def storage_options(self) -> dict[str, Any] | None:
        """The object-store client's options of ``model_dir`` (the `RunConfig`'s)."""
        return self._config.storage_options

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def model(self) -> torch.nn.Module:
        """The live model training updates (evaluation never uses it)."""
        return self._model

    @property
    def optimizer(self) -> Any:
        return self._optimizer

    @property
    def state(self) -> Mapping[str, Any] | None:
        """The extra training state given as ``state=``."""
        return self._state

    def eval_dir(self, name: str | None = None) -> str:
        """Where evaluation ``name`` writes its events: ``model_dir/eval`` or ``eval_<name>``."""
        return eval_dir_for(self.model_dir, name)

    def latest_checkpoint(self) -> str | None:
        """The newest committed checkpoint the index names, or None."""
        location = self._config.location
        return latest_checkpoint(location.path, storage=location.storage)

    def locate(self, path: str | os.PathLike) -> Location:
        """The resolved `Location` of a directory or checkpoint of this estimator (``model_dir``,
        ``eval*/``, ``export/<name>``, a checkpoint path, an export base): through ``model_dir``'s
        storage, built once by the `RunConfig`, when it is on the same store (a local path: the
        local one); a URL of another scheme is resolved with the `RunConfig`'s options."""
        return relocate(self._config.location, path) or resolve_location(path, self._options(path))

    # ------------------------------------------------------------------ train
    def train(self, input_fn: Callable[[], Iterable[Any]], steps: int | None = None,
              max_steps: int | None = None, hooks: Iterable[Any] = (),
              saving_listeners: Iterable[Any] = ()) -> Estimator:
        """Trains on ``input_fn()``'s batches for ``steps`` more steps or up to ``max_steps``;
        returns self. Skips training when a checkpoint at or beyond ``max_steps`` exists (TF's
        behaviour). A re-iterable input (``DataLoader``, list) is iterated again at each
        exhaustion until the limit, its epoch and position checkpointed (a resume continues
        mid-epoch exactly); without a limit it is one epoch. A one-shot iterator that runs out
        before the limit ends training with a WARNING (`supervisor.estimator.inputs`)."""
        hooks, listeners = self._check_train_arguments(input_fn, steps, max_steps, hooks, saving_listeners)
        if max_steps is not None:
            reached = self.checkpoint_step()
            if reached is not None and reached >= max_steps:
                logger.info("Skipping training since max_steps=%d has already been reached (checkpoint of "
                            "step %d in %s)", max_steps, reached, self.model_dir)
                return self
        user_state = dict(self._state or {})
        batches = self._training_input(call_input_fn(input_fn, "Estimator.train"), user_state,
                                       repeat=steps is not None or max_steps is not None)
        state = self._state_with_input(user_state, batches)
        with training_session(self._config, self._model, self._optimizer, state, clock=self._clock, steps=steps,
                              max_steps=max_steps, hooks=hooks, listeners=listeners,
                              init_fn=self._warm_start_fn()) as session:
            target = max_steps if max_steps is not None else (
                None if steps is None else session.global_step + steps)
            while not session.should_stop():
                batch = batches.next_batch()
                if batch is END:
                    log_input_end(batches, session.global_step, target, steps, max_steps)
                    raise StopIteration  # the session's clean end (data exhausted)
                session.run(self._train_step, batch)
        return self

    def _check_train_arguments(self, input_fn: Any, steps: Any, max_steps: Any, hooks: Any,
                               saving_listeners: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Refuses `train`'s bad arguments; returns the hooks and saving listeners as tuples."""
        if self._train_step is None:
            raise ValueError("Estimator.train needs train_step=...: pass train_step(batch) -> {'loss': ...} "
                             "to the Estimator")
        validate_input_fn(input_fn)
        if steps is not None and max_steps is not None:
            raise ValueError(f"Can not provide both steps and max_steps (got steps={steps!r}, "
                             f"max_steps={max_steps!r}); pass one of them")
        v.check_positive_or_none("steps", steps)
        v.check_positive_or_none("max_steps", max_steps)
        return validate_hooks(hooks), validate_saving_listeners(saving_listeners)

    def _training_input(self, source: Iterable[Any], user_state: dict[str, Any], *, repeat: bool) -> TrainingInput:
        """The `TrainingInput` over ``source``: the previous call's when it is the same object (its
        live pass goes on), else a new one; not fast-forwarded when ``source`` is in ``state=``."""
        fast_forward = not any(obj is source for obj in user_state.values())
        batches = self._input
        if batches is None or batches.source is not source or (batches.repeat, batches.fast_forward) != (
                repeat and batches.reiterable, fast_forward and batches.reiterable):
            batches = self._input = TrainingInput(source, repeat=repeat, fast_forward=fast_forward)
        return batches

    def _state_with_input(self, user_state: dict[str, Any], batches: TrainingInput) -> Mapping[str, Any] | None:
        """The training state with the input's position (`INPUT_ENTRY`) when it is tracked or
        the checkpoint to restore holds one; a checkpoint written without it (an older version)
        restores, and the input starts at its beginning."""
        if INPUT_ENTRY in user_state:
            raise ValueError(f"state={{{INPUT_ENTRY!r}: ...}}: the name {INPUT_ENTRY!r} is the Estimator's own "
                             "(the training input's epoch and position); rename the entry")
        latest = self.latest_checkpoint()
        try:
            in_checkpoint = latest is not None and any(
                name.split("/", 1)[0] == INPUT_ENTRY for name in variable_names(self.locate(latest)))
        except Exception:  # noqa: BLE001 - unreadable: the restore reports it (or falls back)
            in_checkpoint = latest is not None and batches.fast_forward
        if in_checkpoint or (latest is None and batches.fast_forward):
            return {**user_state, INPUT_ENTRY: batches}
        if batches.fast_forward:
            logger.warning("%s holds no training-input position (written before epochs were checkpointed): "
                           "the input starts at its beginning", latest)
        return self._state

    def checkpoint_step(self, checkpoint_path: str | None = None) -> int | None:
        """The step of ``checkpoint_path`` (default: the latest checkpoint; None if none)."""
        path = checkpoint_path or self.latest_checkpoint()
        return None if path is None else read_manifest(path, self.locate(path).storage).step

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, input_fn: Callable[[], Iterable[Any]], steps: int | None = None,
                 name: str | None = None, checkpoint_path: str | None = None,
                 hooks: Iterable[Any] = ()) -> dict[str, Any]:
        """Evaluates a checkpoint (default: the latest) on at most ``steps`` batches.

        Returns ``{metric: float, ..., "global_step": checkpoint's step}`` and writes the
        metrics into `eval_dir` (``name``) at that step.

        Raises:
            CheckpointNotFoundError: there is no checkpoint to evaluate.
        """
        validate_input_fn(input_fn)
        v.check_positive_or_none("steps", steps)
        validate_eval_name(name)
        hooks = validate_hooks(hooks)
        path = self._checkpoint_or_latest(checkpoint_path, "evaluate")
        checkpoint = read_checkpoint(path, storage=self.locate(path).storage)
        return self.evaluate_checkpoint(checkpoint, input_fn, steps=steps, name=name, hooks=hooks)

    def evaluate_checkpoint(self, checkpoint: CheckpointRead, input_fn: Callable[[], Iterable[Any]], *,
                            steps: int | None = None, name: str | None = None,
                            hooks: tuple[Any, ...] = ()) -> dict[str, Any]:
        """`evaluate` on a checkpoint already read (`supervisor.checkpoint.read_checkpoint`)."""
        with preserved_rng():
            model, step = self.load_model_copy(checkpoint)
            metrics: dict[str, Any] = evaluate_batches(
                model, call_input_fn(input_fn, "Estimator.evaluate"), steps=steps, eval_step=self._eval_step,
                metrics=self._metrics, hooks=hooks, global_step=step, path=checkpoint.path)
        metrics["global_step"] = step
        directory = self.eval_dir(name)
        events = self._event_files.get(directory)
        if events is None:
            events = self._event_files[directory] = EvalEventsFile(self.locate(directory))
        events.write({k: val for k, val in metrics.items() if k != "global_step"}, step)
        logger.info("Saving dict for global step %d: %s", step,
                    ", ".join(f"{k} = {val:.6g}" for k, val in sorted(metrics.items()) if k != "global_step"))
        return metrics

    def load_model_copy(self, checkpoint: str | CheckpointRead) -> tuple[torch.nn.Module, int]:
        """The evaluation copy of the model with a checkpoint's weights (a path, read and
        verified in one read, or a `CheckpointRead`), in eval mode, and the checkpoint's step.
        The same copy is reused by every call; it is never the live model."""
        if not isinstance(checkpoint, CheckpointRead):
            if self._eval_copy is not None and self._copy_holds == os.fspath(checkpoint):
                return self._eval_copy, self._copy_step  # e.g. exporting what was just evaluated
            checkpoint = read_checkpoint(checkpoint, storage=self.locate(checkpoint).storage)
        payload, checkpoint_path = checkpoint.payload, checkpoint.path
        self._copy_holds = None
        if self._eval_copy is None:
            with torch.no_grad():
                self._eval_copy = copy.deepcopy(unwrap_module(self._model))
        copy_ = self._eval_copy
        entry = model_entry(payload, checkpoint_path, "the Estimator saves its model under the name 'model'")
        copy_.load_state_dict(strip_wrapper_prefixes(entry, copy_.state_dict().keys()))
        copy_.eval()
        self._copy_holds, self._copy_step = checkpoint_path, int(payload[STEP_KEY])
        return copy_, self._copy_step

    # ------------------------------------------------------------------ predict
    def predict(self, input_fn: Callable[[], Iterable[Any]],
                checkpoint_path: str | None = None) -> Iterator[Any]:
        """Yields ``predict_step``'s outputs one example at a time (batches split along dim 0)."""
        validate_input_fn(input_fn)
        path = self._checkpoint_or_latest(checkpoint_path, "predict")
        with preserved_rng():
            model, _ = self.load_model_copy(path)
            batches = iter(call_input_fn(input_fn, "Estimator.predict"))
        while True:
            with preserved_rng(), torch.no_grad():
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                out = self._predict_step(model, batch) if self._predict_step is not None else model(batch)
            yield from _split_examples(out)

    # ------------------------------------------------------------------ variables and export
    def get_variable_names(self) -> list[str]:
        """The names of the latest checkpoint's values (``model/fc.weight``,
        ``optimizer/state/0/exp_avg``, ``global_step``), read without loading the tensors."""
        path = self._checkpoint_or_latest(None, "get_variable_names")
        return variable_names(self.locate(path))

    def get_variable_value(self, name: str) -> Any:
        """One value of the latest checkpoint by its `get_variable_names` name; only that
        tensor's bytes are read (memory-mapped load)."""
        path = self._checkpoint_or_latest(None, "get_variable_value")
        return variable_value(self.locate(path), name)

    def export(self, export_dir_base: str | os.PathLike, checkpoint_path: str | None = None, *,
               eval_result: Mapping[str, Any] | None = None,
               storage_options: Mapping[str, Any] | None = None) -> str:
        """Writes ``<export_dir_base>/<timestamp>/`` (weights, eval result, and a ``torch.export``
        program when ``example_input`` is set) and returns its path (see `exporters`).
        ``export_dir_base`` may be an ``s3://`` URL; its client's options are ``storage_options``,
        else the `RunConfig`'s (those of ``model_dir``'s object store: its client, `locate`)."""
        path = self._checkpoint_or_latest(checkpoint_path, "export")
        if storage_options is None:
            return write_export(self, self.locate(export_dir_base), path, eval_result)
        if storage_options and not is_url(export_dir_base):
            raise ValueError(f"storage_options were given for the local export_dir_base "
                             f"{os.fspath(export_dir_base)!r}; they apply to object-store URLs only (s3://...)")
        return write_export(self, resolve_location(export_dir_base, storage_options or None), path, eval_result)

    # ------------------------------------------------------------------ helpers
    def _warm_start_fn(self) -> Callable[[Any], None] | None:
        if self._warm_start is None:
            return None
        return warm_start_fn(self._warm_start, unwrap_module(self._model), self.locate)

    def _options(self, path: str | os.PathLike) -> dict[str, Any] | None:
        """The `RunConfig`'s ``storage_options`` for a URL ``path``; None for a local one."""
        return options_for(path, self._config.storage_options)

    def _checkpoint_or_latest(self, checkpoint_path: str | None, action: str) -> str:
        if checkpoint_path is not None:
            # a URL is checked by its reader (no manifest: CheckpointNotFoundError)
            if not is_url(checkpoint_path) and not os.path.isdir(os.fspath(checkpoint_path)):
                raise CheckpointNotFoundError(f"{action}: no checkpoint at {os.fspath(checkpoint_path)}")
            return os.fspath(checkpoint_path)
        path = self.latest_checkpoint()
        if path is None:
            raise CheckpointNotFoundError(f"Could not find trained model in model_dir: {self.model_dir}; "
                                          f"train first or pass checkpoint_path= to {action}")
        return path


def _split_examples(out: Any) -> Iterator[Any]:
    if isinstance(out, torch.Tensor):
        yield from out.unbind(0)
    elif isinstance(out, Mapping):
        values = {k: val for k, val in out.items()}
        sizes = {len(val) for val in values.values()}
        if len(sizes) != 1:
            raise ValueError(f"predict_step's outputs must share their first dimension, got sizes "
                             f"{ {k: len(val) for k, val in values.items()} }")
        for i in range(sizes.pop()):
            yield {k: val[i] for k, val in values.items()}
    else:
        raise TypeError(f"predict_step must return a tensor or a dict of tensors, got {type(out).__name__}")
