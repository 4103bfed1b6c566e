"""A training process on an ``s3://`` logdir, configured by the ``AWS_*`` environment alone (as a
user's job is): `MonitoredTrainingSession`, a checkpoint every 3 steps (async), data and dropout
from the global RNG, so a resume is bit-exact only if step, weights, Adam state and RNG all are.

    python trainer.py URL LAST_STEP OUT [--kill-at STEP]

``--kill-at K`` (K % 3 == 2): once step K is taken and checkpoint K - 2 is committed, takes step
K + 1 (whose checkpoint then uploads in the background) and SIGKILLs itself. Prints ``restored N`` at
start; writes the final weights and optimizer state to ``OUT`` (a local file).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch

#: The default's order: a rerun on this host takes a killed trainer's lease over at once (its pid no
#: longer runs), so the test waits for no expiry (a 2 s lease, for a wait that once was one, lost its
#: renewals on a loaded machine).
LEASE_SECS = 30.0
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from hooks import StopAtStepHook  # noqa: E402
from supervisor import MonitoredTrainingSession  # noqa: E402
from supervisor.checkpoint import latest_checkpoint  # noqa: E402


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("last_step", type=int)
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    model, opt = build()

    def step():
        x = torch.randn(4, 8)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    with MonitoredTrainingSession(args.url, model, opt, save_checkpoint_steps=3, save_summaries_steps=None,
                                  log_step_count_steps=None, hooks=[StopAtStepHook(last_step=args.last_step)],
                                  handle_signals=False, lease_secs=LEASE_SECS) as s:
        print(f"restored {s.global_step}", flush=True)
        while not s.should_stop():
            s.run(step)
            if args.kill_at is not None and s.global_step == args.kill_at:
                committed, deadline = f"model.ckpt-{args.kill_at - 2}", time.monotonic() + 120  # (kill_at % 3 == 2)
                while not (latest_checkpoint(args.url) or "").endswith(committed):
                    if time.monotonic() > deadline:
                        sys.exit(f"{committed} was not committed under {args.url} within 120 s")
                    time.sleep(0.01)  # the checkpoint two steps back is committed...
                s.run(step)  # ...the next one is requested at this boundary and uploads in the background
                os.kill(os.getpid(), signal.SIGKILL)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state()},
               args.out)


if __name__ == "__main__":
    main()
