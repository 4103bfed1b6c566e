"""The trainer the sidecar integration tests race against (SPEC §10.4, §15).

`MonitoredTrainingSession` checkpointing **every step** with ``max_to_keep=1``; at step N every
parameter equals ``weight_of(N)`` (tests/estimator/sidecar_helpers.py), so an evaluator that
read a partial or mixed checkpoint would report a value that is not ``weight_of`` of its step.
It trains for ``--duration`` seconds, or until the file ``--until-file`` exists (pausing while
``--pause-file`` exists), then ends
cleanly (the run is marked finished) and prints ``finished step=N``.

    python tests/integration/sidecar_trainer.py LOGDIR --duration 20 --width 512
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from supervisor import MonitoredTrainingSession  # noqa: E402
from tests.estimator.sidecar_helpers import make_model, weight_of  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--until-file", default=None)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--pause-file", default=None, help="no steps while this file exists; once paused, the "
                        "trainer writes its step to PAUSE_FILE.paused (the test's handshake)")
    args = parser.parse_args()
    model = make_model(args.width)
    end = None if args.duration is None else time.monotonic() + args.duration

    def step(next_step: int) -> None:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(weight_of(next_step))
        if args.step_sleep and next_step:
            time.sleep(args.step_sleep)

    def done() -> bool:
        if end is not None and time.monotonic() >= end:
            return True
        return args.until_file is not None and os.path.exists(args.until_file)

    # init_fn: the checkpoint a new session commits at step 0 holds weight_of(0) too.
    with MonitoredTrainingSession(args.logdir, model=model, save_checkpoint_steps=1, save_checkpoint_secs=None,
                                  max_to_keep=1, save_summaries_steps=None, log_step_count_steps=None,
                                  init_fn=lambda session: step(0)) as s:
        print(f"started at step {s.global_step}", flush=True)
        paused = False
        while not done():
            if args.pause_file is not None and os.path.exists(args.pause_file):
                if not paused:  # no step under way now: say at which step (written whole, then renamed)
                    paused = True
                    with open(args.pause_file + ".tmp", "w") as f:
                        f.write(str(s.global_step))
                    os.replace(args.pause_file + ".tmp", args.pause_file + ".paused")
                time.sleep(0.02)  # the pause itself: polls for the file's removal
                continue
            paused = False
            s.run(step, s.global_step + 1)
    print(f"finished step={s.global_step}", flush=True)


if __name__ == "__main__":
    main()
