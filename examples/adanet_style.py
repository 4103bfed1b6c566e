"""AdaNet-style iterative ensemble growth on the runtime: a model whose structure changes.

Each iteration trains candidate subnetworks (here: one-hidden-layer nets of two widths) next to
the frozen ensemble grown so far, through `MonitoredTrainingSession`, for
``--steps-per-iteration`` global steps. Then the chief evaluates every candidate ensemble on a
held-out split, keeps the best, and grows the ensemble: the next iteration's model has one more
frozen subnetwork and new candidates. Its frozen part is warm-started with
`supervisor.restore_partial` from the iteration's final checkpoint, and — as AdaNet's
``_OverwriteCheckpointHook`` did — the checkpoint of that same global step is overwritten with
the grown model and the incremented iteration number (the commit protocol makes the overwrite
atomic). Bookkeeping lives in the checkpoint (entry ``"adanet"``): the iteration number and the
widths of the frozen subnetworks, read back with `supervisor.load_variable` (TF's
``tf.train.load_variable(latest, "current_iteration")`` in AdaNet).

So a SIGKILL at any point resumes in the right iteration at the right step: inside an
iteration the session restores the newest checkpoint (weights, optimizer, data position); during
the switch, the checkpoint is either still the old iteration's last one (the evaluation is redone,
deterministically) or already the grown model's.

Data: scikit-learn's bundled digits (8x8 images, 10 classes) when scikit-learn is installed
(``pip install -e ".[test]"``), else a generated 10-class problem of the same shape.

    python examples/adanet_style.py --logdir runs/adanet             # the chief
    python examples/adanet_style.py --logdir runs/adanet --worker    # follows the chief's iterations

``--worker`` waits (``--worker-timeout-secs``) for the chief to publish each next iteration in
the logdir (AdaNet's ``worker_wait_timeout_secs``), reads that iteration's ensemble from the
same checkpoint it read the iteration number from, and reports its accuracy; it never writes.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from typing import Any

import torch
from torch import nn

import supervisor
from hooks import StopAtStepHook

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quickstart import ShuffledBatches  # noqa: E402

WIDTHS = (8, 32)  # the candidate generator: the same two shapes every iteration
logger = logging.getLogger("adanet_style")


# ---------------------------------------------------------------- data
def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """(train_x, train_y, eval_x, eval_y, source): digits when scikit-learn is there."""
    try:
        from sklearn.datasets import load_digits
        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        source = "scikit-learn digits"
    except ImportError:
        g = torch.Generator().manual_seed(0)
        centers = torch.rand(10, 64, generator=g)
        y = torch.randint(0, 10, (1797,), generator=g)
        x = (centers[y] + 0.3 * torch.randn(1797, 64, generator=g)).clamp(0, 1)
        source = "generated data (scikit-learn not installed)"
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[:1400], y[:1400], x[1400:], y[1400:], source


# ---------------------------------------------------------------- the model of one iteration
def subnetwork_name(iteration: int, width: int) -> str:
    return f"t{iteration}_w{width}"


class Subnetwork(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Ensemble(nn.Module):
    """The frozen ensemble (one subnetwork per past iteration) plus this iteration's candidates.

    Parameters are named ``subnets.<name>.*`` and ``mixture.<name>``, so a subnetwork keeps its
    key when it moves from candidate to frozen, and `restore_partial` can carry it over.
    """

    def __init__(self, frozen_widths: list[int], iteration: int, candidate_widths: tuple[int, ...]) -> None:
        super().__init__()
        self.frozen = [subnetwork_name(t, w) for t, w in enumerate(frozen_widths)]
        self.candidates = [subnetwork_name(iteration, w) for w in candidate_widths]
        self.subnets = nn.ModuleDict()
        self.mixture = nn.ParameterDict()
        for i, name in enumerate(self.frozen + self.candidates):
            with torch.random.fork_rng():  # the same initial weights whatever ran before
                torch.manual_seed(1000 + 7919 * iteration + i)
                self.subnets[name] = Subnetwork(int(name.rsplit("_w", 1)[1]))
            self.mixture[name] = nn.Parameter(torch.ones(()))
        for name in self.frozen:
            self.subnets[name].requires_grad_(False)
            self.mixture[name].requires_grad_(False)

    def frozen_logits(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(x), 10)
        for name in self.frozen:
            out = out + self.mixture[name] * self.subnets[name](x)
        return out

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits of every candidate ensemble (frozen part + one candidate); ``{"": frozen}`` at the end."""
        base = self.frozen_logits(x)
        if not self.candidates:
            return {"": base}
        return {c: base + self.mixture[c] * self.subnets[c](x) for c in self.candidates}


class Bookkeeping:
    """The iteration number and the frozen subnetworks' widths: checkpointed as entry "adanet"."""

    def __init__(self, iteration: int = 0, frozen_widths: list[int] | None = None) -> None:
        self.iteration, self.frozen_widths = iteration, list(frozen_widths or [])

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "frozen_widths": list(self.frozen_widths)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.iteration, self.frozen_widths = int(sd["iteration"]), [int(w) for w in sd["frozen_widths"]]


def read_bookkeeping(checkpoint: str | None) -> Bookkeeping:
    """The iteration and frozen widths recorded in ``checkpoint`` (iteration 0 when None)."""
    if checkpoint is None:
        return Bookkeeping()
    iteration = int(supervisor.load_variable(checkpoint, "adanet/iteration"))
    widths = [int(w) for w in supervisor.load_variable(checkpoint, "adanet/frozen_widths").tolist()]
    return Bookkeeping(iteration, widths)


def build(book: Bookkeeping, iterations: int) -> tuple[Ensemble, torch.optim.Optimizer | None]:
    """The model (and optimizer) of iteration ``book.iteration``; no candidates once done."""
    candidates = WIDTHS if book.iteration < iterations else ()
    model = Ensemble(book.frozen_widths, book.iteration, candidates)
    trainable = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.Adam(trainable, lr=1e-2) if trainable else None


# ---------------------------------------------------------------- the chief
class Crash:
    """``--crash-at POINT`` for the resume tests: SIGKILL this process at a named point;
    ``--crash-at pause:POINT`` stops there (sleeping) for the test to SIGKILL it from outside."""

    def __init__(self, spec: str | None) -> None:
        self.spec = spec

    def at(self, point: str) -> None:
        if self.spec == point:
            print(f"crashing at {point}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.spec == f"pause:{point}":
            print(f"paused at {point}", flush=True)
            time.sleep(3600)


def train_iteration(args: argparse.Namespace, book: Bookkeeping, batches: ShuffledBatches, crash: Crash) -> Ensemble:
    """Trains the candidates of ``book.iteration`` to the iteration's last step, resuming if needed."""
    model, optimizer = build(book, args.iterations)
    last_step = (book.iteration + 1) * args.steps_per_iteration

    def train_step(batch: tuple[torch.Tensor, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
        crash.at(f"step:{step}")
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        losses = {c: nn.functional.cross_entropy(logits, y) for c, logits in model(x).items()}
        loss = sum(losses.values())
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    with supervisor.MonitoredTrainingSession(
            args.logdir, model=model, optimizer=optimizer, state={"data": batches, "adanet": book},
            hooks=[StopAtStepHook(last_step=last_step)], save_checkpoint_secs=None,
            save_checkpoint_steps=args.save_steps, log_step_count_steps=None, save_summaries_steps=None,
            max_to_keep=3) as s:
        print(f"iteration {book.iteration}: training {model.candidates} from step {s.global_step} "
              f"to {last_step} (frozen: {model.frozen})", flush=True)
        while not s.should_stop():
            s.run(train_step, next(batches), s.global_step)
    return model


def evaluate(model: Ensemble, x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple[float, float]]:
    """``{candidate: (loss, accuracy)}`` on the held-out split."""
    with torch.no_grad():
        return {c: (nn.functional.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item())
                for c, logits in model(x).items()}


def grow(args: argparse.Namespace, book: Bookkeeping, best_width: int, batches: ShuffledBatches,
         crash: Crash) -> Bookkeeping:
    """The iteration switch: warm-start the grown model and overwrite the last checkpoint with it."""
    step = (book.iteration + 1) * args.steps_per_iteration
    previous = os.path.join(args.logdir, f"model.ckpt-{step}")
    nxt = Bookkeeping(book.iteration + 1, book.frozen_widths + [best_width])
    model, optimizer = build(nxt, args.iterations)
    frozen = [f"subnets.{n}.*" for n in model.frozen] + [f"mixture.{n}" for n in model.frozen]
    report = supervisor.restore_partial(previous, model, include=frozen, strict=True)
    logger.info("iteration %d warm start: %s", nxt.iteration, report)
    state = {"model": model, "data": batches, "adanet": nxt}
    if optimizer is not None:
        state["optimizer"] = optimizer
    manager = supervisor.CheckpointManager(args.logdir, max_to_keep=3)
    manager.open()
    try:
        manager.save(step, supervisor.TrainingState(state))  # same step: replaces the old iteration's
        crash.at(f"switch:{book.iteration}:overwrite")       # mid-write: the commit is all or nothing
    finally:
        manager.close()
    return nxt


def chief(args: argparse.Namespace) -> dict[str, Any]:
    train_x, train_y, eval_x, eval_y, source = load_data()
    print(f"data: {source}, {len(train_x)} train / {len(eval_x)} eval examples", flush=True)
    crash = Crash(args.crash_at)
    batches = ShuffledBatches(train_x, train_y, batch_size=64, seed=0)
    while True:
        book = read_bookkeeping(supervisor.latest_checkpoint(args.logdir))
        if book.iteration >= args.iterations:
            break
        model = train_iteration(args, book, batches, crash)
        scores = evaluate(model, eval_x, eval_y)
        best = min(scores, key=lambda c: (scores[c][0], c))
        print(f"iteration {book.iteration}: " + ", ".join(
            f"{c} loss {loss:.4f} acc {acc:.3f}" for c, (loss, acc) in scores.items()) + f"; best {best}", flush=True)
        crash.at(f"switch:{book.iteration}:evaluated")
        grow(args, book, int(best.rsplit("_w", 1)[1]), batches, crash)
    final, _ = build(book, args.iterations)
    final.load_state_dict(supervisor.load_checkpoint(supervisor.latest_checkpoint(args.logdir))["model"])
    loss, accuracy = evaluate(final, eval_x, eval_y)[""]
    print(f"final ensemble after {book.iteration} iterations: {final.frozen}; eval loss {loss:.4f}, "
          f"accuracy {accuracy:.3f}", flush=True)
    return {"ensemble": final.frozen, "accuracy": accuracy}


# ---------------------------------------------------------------- the worker
def wait_for_iteration(logdir: str, iteration: int, timeout_secs: float,
                       poll_secs: float = 0.2) -> tuple[str, Bookkeeping]:
    """Waits until the chief's newest committed checkpoint is at ``iteration`` or later.

    Returns that checkpoint's path and bookkeeping (read from the same checkpoint, so the
    ensemble read next matches the iteration number). ``TimeoutError`` after ``timeout_secs``.
    """
    deadline = time.monotonic() + timeout_secs
    while True:
        path = supervisor.latest_checkpoint(logdir)
        if path is not None:
            try:
                book = read_bookkeeping(path)
                if book.iteration >= iteration:
                    return path, book
            except (supervisor.CheckpointError, KeyError):
                pass  # replaced or deleted by the chief meanwhile: look again
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the chief did not publish iteration {iteration} in {logdir} within "
                               f"{timeout_secs:g} s; it may have crashed or been stopped")
        time.sleep(poll_secs)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Follows the chief: for each next iteration, waits for it, then reports its frozen ensemble."""
    _, _, eval_x, eval_y, _ = load_data()
    iteration, seen = 1, []
    while iteration <= args.iterations:
        path, _ = wait_for_iteration(args.logdir, iteration, args.worker_timeout_secs)
        try:  # one verified read: the iteration switch replaces a checkpoint at the same path
            payload = supervisor.load_checkpoint(path)
        except supervisor.CheckpointError:
            continue  # replaced while being read: wait again
        book = Bookkeeping()
        book.load_state_dict(payload["adanet"])
        if book.iteration < iteration:
            continue  # an older iteration's checkpoint took the path back meanwhile: wait again
        model, _ = build(book, args.iterations)
        model.load_state_dict(payload["model"])
        with torch.no_grad():
            accuracy = (model.frozen_logits(eval_x).argmax(1) == eval_y).float().mean().item()
        print(f"worker: iteration {book.iteration} published in {os.path.basename(path)}; frozen ensemble "
              f"{model.frozen}, accuracy {accuracy:.3f}", flush=True)
        seen.append(book.iteration)
        iteration = book.iteration + 1
    return {"iterations": seen}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/adanet")
    parser.add_argument("--iterations", type=int, default=3, help="how many subnetworks the ensemble grows to")
    parser.add_argument("--steps-per-iteration", type=int, default=150, help="AdaNet's max_iteration_steps")
    parser.add_argument("--save-steps", type=int, default=25, help="checkpoint every N steps")
    parser.add_argument("--worker", action="store_true", help="follow the chief's iterations instead of training")
    parser.add_argument("--worker-timeout-secs", type=float, default=600.0,
                        help="how long a worker waits for the chief's next iteration")
    parser.add_argument("--crash-at", default=None, help=argparse.SUPPRESS)  # tests: SIGKILL at a named point
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("iterations", "steps_per_iteration", "save_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not args.worker:
        chief(args)
        return 0
    try:
        worker(args)
    except TimeoutError as e:
        print(f"worker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
