"""A 20-line training program under `MonitoredTrainingSession` (a point of ``loss`` at every step,
a checkpoint every ``SAVE_STEPS``), for the curve-point and refused-writer tests
(tests/integration/test_curve_points.py, test_refused_writer.py):

    python curve_trainer.py LOGDIR MAX_STEPS MODE [STORAGE_OPTIONS_JSON]

MODE ``kill``: the process SIGKILLs itself right after the first checkpoint it commits beyond
the step it started from and before MAX_STEPS (on the checkpoint writer thread, the moment the
commit is published: `CheckpointManager.on_commit`), printing ``killed after N`` first; without
such a commit it trains to MAX_STEPS and prints ``finished N``. Each step first waits for the
save in flight, so a kill after the commit of step N comes before any point of a later step (the
points it can lose are exactly those up to N, whatever the machine's load). MODE ``hold``: prints ``holding`` once the
session is created (it holds the logdir) and its first checkpoint committed, then waits for the file ``$RELEASE_FILE`` and ends cleanly.
"""
import json
import os
import signal
import sys
import time

import torch

from supervisor import Hook, MonitoredTrainingSession

SAVE_STEPS = 7
logdir, max_steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


class KillRightAfterACommit(Hook):
    def after_create_session(self, session, coord):
        start = session.global_step

        def on_commit(step, path):
            if start < step < max_steps:
                print(f"killed after {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        session.checkpoint_manager.on_commit = on_commit
        self.manager = session.checkpoint_manager

    def before_run(self, run_context):
        self.manager.wait()  # a step starts once the save in flight committed: the kill comes before it


def train():
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return {"loss": loss}


with MonitoredTrainingSession(logdir, model, opt, hooks=[KillRightAfterACommit()], save_checkpoint_secs=None,
                              save_checkpoint_steps=SAVE_STEPS, save_summaries_steps=1, log_step_count_steps=None,
                              storage_options=options) as s:
    if mode == "hold":  # the checkpoint of the creation committed; until the file $RELEASE_FILE exists
        s.checkpoint_manager.wait()
        print("holding", flush=True)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    while s.global_step < max_steps and mode == "kill":
        s.run(train)
print(f"finished {s.global_step}", flush=True)
