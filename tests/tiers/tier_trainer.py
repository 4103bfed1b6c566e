"""The trainer tests/tiers/test_tier_kills.py kills with SIGKILL (SPEC §17).

A deterministic CPU model (Adam: the optimizer state matters) trained under
`MonitoredTrainingSession` with ``local_dir``: a checkpoint every step to the local tier, one
every ``--persist-steps`` steps copied to the logdir (a local path or an ``s3://`` URL; the
endpoint in ``S3_ENDPOINT``). Each step's batch depends only on the step, so a resumed run matches
an uninterrupted one bit for bit exactly when the restore brought back the weights and Adam's state.

Kill seam (this script only; the library runs unchanged): ``KILL_AT="point:n"`` SIGKILLs this
process the ``n``-th time it reaches ``point``:

=============  ==================================================================
local-write    the local save's ``state.pt`` half written (writer thread)
local-commit   the local save sealed, before it is committed (writer thread)
copy-write     a file of the persist copy half sent to the logdir (persist thread)
copy-commit    every file of the copy in the logdir, before its manifest/rename
copy-publish   the copy committed in the logdir, before the logdir's index names it
=============  ==================================================================

Output: the library's INFO lines on stderr (``restored step=N from PATH``), ``finished`` and the
final weights and optimizer state in ``--out``.

    KILL_AT=copy-write:2 python tests/tiers/tier_trainer.py LOGDIR LOCAL --steps 40 --out w.pt
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

import torch

import supervisor
from hooks import StopAtStepHook
from supervisor.checkpoint.load import torch_format
from supervisor.checkpoint.save import publish, temp
from supervisor.checkpoint.tiers import copy as tier_copy
from tests.tiers.kill_switch import KillSwitch

POINTS = ("local-write", "local-commit", "copy-write", "copy-commit", "copy-publish")
_switch = KillSwitch("KILL_AT")
_reached = _switch.reached


def _in_persist_thread() -> bool:
    return threading.current_thread().name == "supervisor-checkpoint-persist"


def install_seams() -> None:
    serialize, stream, finalize, publish_ = torch_format.serialize, tier_copy._stream, \
        temp.TempCheckpoint.finalize, publish.Publisher.publish
    # the name the torch format's write looks up at each save (test_every_kill_point_of_the_trainer_is_reached)
    torch_format.serialize = lambda payload, w: serialize(payload, _switch.half_writer(w, "local-write"))
    tier_copy.COPY_CHUNK_BYTES = 64 << 10
    tier_copy._stream = lambda s, src, m, rel, w: stream(s, src, m, rel, _switch.half_writer(w, "copy-write"))

    def finalize_(self, **kwargs):
        _reached("copy-commit" if _in_persist_thread() else "local-commit")
        return finalize(self, **kwargs)

    def publish_seam(self, name, timestamp, *metric):
        if _in_persist_thread():
            _reached("copy-publish")
        return publish_(self, name, timestamp, *metric)
    temp.TempCheckpoint.finalize, publish.Publisher.publish = finalize_, publish_seam


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 8))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, global_step: int) -> None:
    """One step on the batch of ``global_step`` (a function of the step alone)."""
    g = torch.Generator().manual_seed(global_step)
    x, y = torch.randn(32, 128, generator=g), torch.randn(32, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def final_state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("logdir")
    parser.add_argument("local_dir")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--persist-steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--persist-grace", type=float, default=120.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    install_seams()
    model, opt = build()
    endpoint = os.environ.get("S3_ENDPOINT")
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"} if endpoint else None
    with supervisor.MonitoredTrainingSession(
            args.logdir, model, opt, local_dir=args.local_dir, save_checkpoint_steps=1,
            persist_every_steps=args.persist_steps, hooks=[StopAtStepHook(last_step=args.steps)],
            save_summaries_steps=None, log_step_count_steps=None, storage_options=options,
            max_to_keep=3, local_max_to_keep=2, persist_grace_secs=args.persist_grace) as s:
        while not s.should_stop():
            s.run(train_step, model, opt, s.global_step)
    torch.save(final_state(model, opt, s.global_step), args.out)
    print("finished", flush=True)


if __name__ == "__main__":
    main()
