"""Training input across epochs (SPEC §10.2's epochs rule), for `Estimator.train` and
``train_and_evaluate``.

``input_fn()`` returns either

- a **re-iterable** (a ``DataLoader``, a list — anything that is not itself an iterator, so each
  ``iter()`` gives a fresh pass): with a step limit (``steps`` / ``max_steps``) training iterates
  it again at each exhaustion until the limit, calling ``set_epoch(epoch)`` on its
  ``DistributedSampler`` (or any sampler with ``set_epoch``) before each pass. The epoch and the
  position inside it are part of the checkpointed training state (entry ``input_position``), with
  the torch CPU RNG state the pass started from, so a resume continues mid-epoch exactly: the
  pass is re-created from that RNG state (same shuffle order) and the batches already trained on
  are drawn and discarded. Without a step limit it is iterated once (one epoch), like
  ``for batch in loader``. A re-iterable that is itself in the estimator's ``state=`` (e.g. a
  ``StatefulDataLoader``) checkpoints its own position: it is re-iterated but not fast-forwarded.
  A loader with its own ``generator=`` must checkpoint that generator itself (``state=``).
  Consecutive ``train()`` calls of one process on the same object (``input_fn=lambda: loader``,
  e.g. `Experiment`'s train/evaluate iterations) go on with the live pass, without a
  fast-forward.
- a **one-shot iterator** (a generator, an iterator object): iterated until it runs out. Running
  out before the step limit ends training with a WARNING naming the step reached and the limit;
  a resumed run calls ``input_fn()`` afresh and starts at its beginning.

Example::

    est.train(lambda: DataLoader(ds, batch_size=32, shuffle=True), max_steps=10_000)  # many epochs
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any, Callable

import torch

__all__ = ["INPUT_ENTRY", "END", "TrainingInput", "call_input_fn", "log_input_end"]

logger = logging.getLogger(__name__)

#: The training-state entry holding the input's epoch and position.
INPUT_ENTRY = "input_position"


class _End:
    def __repr__(self) -> str:
        return "<end of input>"


#: What `TrainingInput.next_batch` returns when the input has ended.
END: Any = _End()


def call_input_fn(input_fn: Callable[[], Any], where: str) -> Iterable[Any]:
    """``input_fn()``, checked to be an iterable of batches (the error names ``input_fn``)."""
    source = input_fn()
    if not isinstance(source, Iterable):
        raise TypeError(f"input_fn of {where} must return an iterable of batches (a DataLoader, a list, a "
                        f"generator), but {input_fn!r} returned {type(source).__name__} {source!r:.80}; "
                        "return the batches, e.g. input_fn=lambda: loader")
    return source


class TrainingInput:
    """The batches of one training ``input_fn()`` across epochs (see the module docstring).

    Args:
        source: what ``input_fn()`` returned.
        repeat: iterate a re-iterable again at each exhaustion (a step limit is set).
        fast_forward: on resume, skip the batches of the current epoch already trained on
            (False when ``source`` checkpoints its own position).
    """

    def __init__(self, source: Iterable[Any], *, repeat: bool, fast_forward: bool = True) -> None:
        self.source = source
        self.reiterable = not isinstance(source, Iterator)
        self.repeat = repeat and self.reiterable
        self.fast_forward = fast_forward and self.reiterable
        self.epoch = 0
        self.position = 0  # batches handed out in the current epoch
        self._epoch_rng: torch.Tensor | None = None  # torch CPU RNG state the epoch's pass began from
        self._iterator: Iterator[Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        rng = self._epoch_rng if self._epoch_rng is not None else torch.empty(0, dtype=torch.uint8)
        return {"epoch": self.epoch, "position": self.position, "rng": rng}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        epoch, position = int(state["epoch"]), int(state["position"])
        if self._iterator is not None and (epoch, position) == (self.epoch, self.position):
            return  # this process's pass is already there (consecutive train() calls): go on with it
        self.epoch, self.position = epoch, position
        rng = state.get("rng")
        self._epoch_rng = rng.clone() if isinstance(rng, torch.Tensor) and rng.numel() else None
        self._iterator = None
        if not self.fast_forward:
            self.position = 0  # the source resumes itself (or cannot): start a pass from its beginning

    def next_batch(self) -> Any:
        """The next batch, or `END` when the input has ended."""
        if self._iterator is None:
            self._start_epoch(skip=self.position)
        while True:
            try:
                batch = next(self._iterator)
            except StopIteration:
                if not self.repeat:
                    return END
                if self.position == 0:
                    raise ValueError(f"the training input {type(self.source).__name__} produced no batch in epoch "
                                     f"{self.epoch}; give input_fn data to train on") from None
                self.epoch, self.position = self.epoch + 1, 0
                logger.info("training input: starting epoch %d", self.epoch)
                self._start_epoch(skip=0)
                continue
            self.position += 1
            return batch

    def _start_epoch(self, skip: int) -> None:
        _set_epoch(self.source, self.epoch)
        if not (skip and self.fast_forward):
            self._epoch_rng = torch.get_rng_state()
            self._iterator = iter(self.source)
            return
        # Resume mid-epoch: re-create the pass from the RNG state it began from (the shuffle order),
        # discard the batches already trained on, and go on with the restored RNG state.
        current = torch.get_rng_state()
        if self._epoch_rng is not None:
            torch.set_rng_state(self._epoch_rng)
        try:
            self._iterator = iter(self.source)
            for done in range(skip):
                if next(self._iterator, END) is END:
                    logger.warning("the training input has %d batches in epoch %d, fewer than the %d the "
                                   "checkpoint had trained on; it changed since: going on from its end",
                                   done, self.epoch, skip)
                    break
        finally:
            torch.set_rng_state(current)
        logger.info("training input: resuming epoch %d at batch %d", self.epoch, skip)


def _set_epoch(source: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the source's sampler(s) that have it (``DistributedSampler``)."""
    samplers = [getattr(source, "sampler", None), getattr(getattr(source, "batch_sampler", None), "sampler", None)]
    seen: list[Any] = []
    for sampler in samplers:
        if sampler is not None and callable(getattr(sampler, "set_epoch", None)) and \
                not any(s is sampler for s in seen):
            sampler.set_epoch(epoch)
            seen.append(sampler)


def log_input_end(batches: TrainingInput, step: int, target: int | None, steps: int | None,
                  max_steps: int | None) -> None:
    """Logs why training ends at ``step``: the input ran out (a WARNING before the limit)."""
    kind = type(batches.source).__name__
    if target is not None and step < target:
        limit = f"max_steps={max_steps}" if max_steps is not None else f"steps={steps} (step {target})"
        logger.warning("training ends at step %d, before %s: the training input (a one-shot %s returned by "
                       "input_fn) ran out; return a re-iterable (a DataLoader, a list) to train for several "
                       "epochs, or an endless iterator", step, limit, kind)
    else:
        logger.info("training ends at step %d: the training input (%s) ran out%s", step, kind,
                    " after one epoch (no steps/max_steps: one pass over the data)" if batches.reiterable else "")
