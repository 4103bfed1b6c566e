"""The torchrun job of benchmarks/recovery.py: examples/ddp_torchrun.py's model and session, with
a fixed time per step (``--step-secs``, so a kill lands mid-run) and a log of what each rank did
when: one JSON line per event in ``<events>/rank<R>.jsonl`` (``start``: session created, with the
restored step; ``step``: a step done; ``raised``: the session saw the exception that ends this
rank; ``error``: the session is closed and the exception leaves it; ``destroyed``: the process
group is destroyed; ``exit``: the interpreter's last ``atexit`` call),
each with ``time.time()``, the rank, its pid and torchrun's attempt."""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.ddp_torchrun import Net, batch  # noqa: E402
from hooks import StopAtStepHook  # noqa: E402
from supervisor import Hook, MonitoredTrainingSession, distributed  # noqa: E402


class EventLog:
    def __init__(self, directory: str, rank: int) -> None:
        self._file = open(os.path.join(directory, f"rank{rank}.jsonl"), "a")
        self._fixed = {"rank": rank, "pid": os.getpid(),
                       "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(json.dumps({"event": event, "t": time.time(), **self._fixed, **fields}) + "\n")
        self._file.flush()


class StepLog(Hook):
    def __init__(self, log: EventLog) -> None:
        self.log = log

    def after_create_session(self, session, coord) -> None:
        self.log.write("start", step=session.global_step)

    def after_run(self, run_context, run_values) -> None:
        self.log.write("step", step=run_context.session.global_step)

    def on_exception(self, session, exc) -> None:
        self.log.write("raised", error=f"{type(exc).__name__}: {exc}"[:2000])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--step-secs", type=float, default=0.02)
    parser.add_argument("--stop-grace-secs", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    distributed.init_process_group("gloo", timeout_secs=120)
    rank = distributed.rank()
    log = EventLog(args.events, rank)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

        def train_step(step: int) -> dict[str, torch.Tensor]:
            x, y = batch(rank, step)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            time.sleep(args.step_secs)
            return {"loss": loss.detach()}

        with MonitoredTrainingSession(args.logdir, model=model, optimizer=optimizer,
                                      hooks=[StopAtStepHook(last_step=args.steps), StepLog(log)],
                                      save_checkpoint_steps=args.save_steps, save_checkpoint_secs=None,
                                      log_step_count_steps=None, save_summaries_steps=None,
                                      stop_grace_secs=args.stop_grace_secs, max_wait_secs=120) as session:
            while not session.should_stop():
                session.run(train_step, session.global_step)
        log.write("done", step=session.global_step)
    except BaseException as e:
        log.write("error", error=f"{type(e).__name__}: {e}"[:2000])  # after the session's close
        raise
    finally:
        distributed.destroy_process_group()
        log.write("destroyed")
        atexit.register(log.write, "exit")  # runs after the interpreter joined its threads


if __name__ == "__main__":
    main()
