"""A trainer on an ``s3://`` logdir whose endpoint may go silent (tests/integration/s3/
test_black_hole_training.py): `MonitoredTrainingSession`, a checkpoint every ``SAVE_STEPS``
steps (async, multipart: ``state.pt`` is about 12 MiB in 5 MiB parts), summaries every step,
every request bounded by ``--bound`` seconds (``storage_options["request_timeout"]``).

    python silent_trainer.py ENDPOINT URL LAST_STEP --bound SECS --lease SECS

Prints ``step N`` every ``SAVE_STEPS`` steps and ``finished N`` at the end; an error ends it
with its traceback on stderr (exit status 1).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from hooks import StopAtStepHook  # noqa: E402
from supervisor import MonitoredTrainingSession  # noqa: E402
from tests.s3_fixtures import options  # noqa: E402

SAVE_STEPS = 5
#: Each step takes at least this long, so that the run spans the test's silent window.
STEP_SECS = 0.05


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("url")
    parser.add_argument("last_step", type=int)
    parser.add_argument("--bound", type=float, required=True)
    parser.add_argument("--lease", type=float, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    storage_options = {**options(args.endpoint), "request_timeout": args.bound, "part_size": 5 << 20}

    def step():
        started = time.monotonic()
        opt.zero_grad()
        loss = model(torch.randn(8, 1024)).pow(2).mean()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, STEP_SECS - (time.monotonic() - started)))
        return {"loss": loss.detach()}

    with MonitoredTrainingSession(args.url, model, opt, save_checkpoint_steps=SAVE_STEPS, save_checkpoint_secs=None,
                                  save_summaries_steps=1, log_step_count_steps=None, handle_signals=False,
                                  hooks=[StopAtStepHook(last_step=args.last_step)], lease_secs=args.lease,
                                  storage_options=storage_options) as s:
        while not s.should_stop():
            s.run(step)
            if s.global_step % SAVE_STEPS == 0:
                print(f"step {s.global_step}", flush=True)
        print(f"finished {s.global_step}", flush=True)


if __name__ == "__main__":
    main()
