"""The trainer that tests/integration/test_exact_resume.py kills (SPEC §2 "Exact resume").

The README's loops, for real: a model with ``Dropout(0.25)`` under bfloat16 autocast (CPU), AdamW,
a per-step LR scheduler, and either

- ``--loop forelse``: a shuffled torchdata ``StatefulDataLoader`` in the training state (with
  ``--generator``: its own ``generator=``; with ``--workers N``: N worker processes), iterated
  with the README's ``for batch in loader: ... else: s.save_checkpoint()`` loop, or
- ``--loop while``: ``while not s.should_stop(): s.run(train_step, next(batches))`` with the
  quickstart's stateful ``ShuffledBatches`` iterator,

under ``--front supervisor`` (time-based checkpoints every ``--save-secs``) or ``--front mts``
(``MonitoredTrainingSession``, a checkpoint every ``--save-steps`` steps). Every session starts
from the same seeds, so a run killed and resumed must end bit-identical to one never killed.

Output (stdout, unbuffered; the parent parses it): ``ready``; the library's INFO lines
(``restored step=N from PATH`` / ``initialised from scratch``); ``transient after open: [...]``
(leftover temp entries once the session is created); ``step N`` after each step;
``epoch-end save at step N`` in the for/else ``else``; ``finished step=N`` once the final state
(model, optimizer, scheduler, data position, loader generators, one draw of each global
generator) is in ``--out``; ``stopped early at step N`` after a clean stop (SIGTERM) before
``--steps``. ``--die-after-epoch-save E`` SIGKILLs the process right after the checkpoint of the
E-th epoch end is committed (the next life must resume from an epoch-end checkpoint).

    python tests/integration/exact_resume_trainer.py LOGDIR --front mts --steps 23 --out w.pt
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"))
from quickstart import ShuffledBatches  # noqa: E402

SAMPLES, BATCH = 40, 8  # 5 batches per epoch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("--front", choices=("supervisor", "mts"), default="supervisor")
    parser.add_argument("--loop", choices=("forelse", "while"), default="forelse")
    parser.add_argument("--generator", action="store_true", help="StatefulDataLoader(generator=g)")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-secs", type=float, default=0.05, help="Supervisor's save_model_secs")
    parser.add_argument("--save-steps", type=int, default=3, help="MTS's save_checkpoint_steps")
    parser.add_argument("--step-sleep-secs", type=float, default=0.01, help="room for the parent's kills")
    parser.add_argument("--die-after-epoch-save", type=int, default=0, metavar="E")
    parser.add_argument("--out", required=True)
    parser.add_argument("--wait-for-go", action="store_true")
    return parser.parse_args(argv)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)
    return torch.utils.data.TensorDataset(torch.randn(SAMPLES, 8, generator=g),
                                          torch.randint(0, 4, (SAMPLES,), generator=g))


def make_data(args: argparse.Namespace) -> Any:
    if args.loop == "while":
        data = dataset()
        return ShuffledBatches(data.tensors[0], data.tensors[1], batch_size=BATCH, seed=7)
    from torchdata.stateful_dataloader import StatefulDataLoader

    generator = torch.Generator().manual_seed(99) if args.generator else None
    # Without generator=, the loader's RandomSampler seeds itself from the global torch RNG here.
    return StatefulDataLoader(dataset(), batch_size=BATCH, shuffle=True, generator=generator,
                              num_workers=args.workers)


def open_session(args: argparse.Namespace, model: nn.Module, optimizer: Any, state: dict) -> Any:
    from hooks import StopAtStepHook
    from supervisor import MonitoredTrainingSession, Supervisor

    stop = [StopAtStepHook(last_step=args.steps)]
    if args.front == "supervisor":
        sv = Supervisor(args.logdir, model=model, optimizer=optimizer, state=state, hooks=stop,
                        save_model_secs=args.save_secs, save_summaries_secs=0)
        return sv.managed_session()
    return MonitoredTrainingSession(args.logdir, model=model, optimizer=optimizer, state=state, hooks=stop,
                                    save_checkpoint_steps=args.save_steps, save_checkpoint_secs=None,
                                    save_summaries_steps=None, save_summaries_secs=None,
                                    log_step_count_steps=None)


def wait_committed(logdir: str, step: int, timeout_secs: float = 30) -> None:
    """Blocks until the index names the checkpoint of ``step``."""
    import supervisor

    deadline = time.monotonic() + timeout_secs
    while time.monotonic() < deadline:
        index = supervisor.get_checkpoint_state(logdir)
        if index is not None and index.model_checkpoint_path.endswith(f"-{step}"):
            return
        time.sleep(0.005)
    raise SystemExit(f"the checkpoint of step {step} was not committed within {timeout_secs} s")


def train(args: argparse.Namespace, s: Any, data: Any, train_step: Any) -> None:
    """The README's loops, verbatim but for the prints and the optional suicide."""
    if args.loop == "while":
        while not s.should_stop():
            s.run(train_step, next(data))
            print(f"step {s.global_step}", flush=True)
        return
    epochs = 0
    while not s.should_stop():
        for batch in data:
            if s.should_stop():
                break
            s.run(train_step, batch)
            print(f"step {s.global_step}", flush=True)
        else:
            s.save_checkpoint()
            epochs += 1
            print(f"epoch-end save at step {s.global_step}", flush=True)
            if epochs == args.die_after_epoch_save:
                wait_committed(args.logdir, s.global_step)
                print(f"killing after the epoch-end checkpoint of step {s.global_step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("supervisor").setLevel(logging.INFO)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.8)
    data = make_data(args)

    def train_step(batch: Any) -> torch.Tensor:
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x).float(), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if args.step_sleep_secs:
            time.sleep(args.step_sleep_secs)
        return loss.detach()

    print("ready", flush=True)
    if args.wait_for_go and sys.stdin.readline().strip() != "go":
        return
    with open_session(args, model, optimizer, {"scheduler": scheduler, "data": data}) as s:
        leftovers = sorted(n for n in os.listdir(args.logdir) if ".tmp-" in n or ".deleting-" in n)
        print(f"transient after open: {leftovers}", flush=True)
        train(args, s, data, train_step)
        step = s.global_step
    if step < args.steps:
        print(f"stopped early at step {step}", flush=True)
        return
    torch.save(final_state(model, optimizer, scheduler, data), args.out)
    print(f"finished step={step}", flush=True)


def final_state(model: nn.Module, optimizer: Any, scheduler: Any, data: Any) -> dict:
    generators = [g.get_state() for g in (getattr(data, "generator", None),
                                          getattr(getattr(data, "sampler", None), "generator", None))
                  if isinstance(g, torch.Generator)]
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "data": data.state_dict(), "loader_generators": generators,
            "draws": (torch.rand(4), random.random(), float(np.random.random()))}


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
