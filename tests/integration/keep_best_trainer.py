"""A trainer that evaluates every 2 steps and keeps the best 2 checkpoints by the evaluation's
``loss`` (and the newest 1): ``python keep_best_trainer.py LOGDIR LAST_STEP [STORAGE_OPTIONS_JSON]``.

The weight ``w`` grows by 1 per step (SGD, lr 1, loss ``-w``); the evaluation's loss is
``|w - 4|``, so the best evaluated checkpoints are steps 4 (0.0) and 2 (2.0; a tie with step 6
keeps the older) and every later one is worse: they are old and must survive recency retention,
also across a SIGKILL and a restart (the metrics come back from the index)."""
from __future__ import annotations

import json
import sys

import torch

from hooks import EvaluationHook, StopAtStepHook
from supervisor import MonitoredTrainingSession


def main(logdir: str, last_step: int, storage_options: dict | None = None, save_steps: int | None = None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    evaluation = EvaluationHook([0], lambda m, _: {"loss": (m.weight.sum() - 4).abs()}, every_n_steps=2)
    with MonitoredTrainingSession(logdir, model, opt, hooks=[evaluation, StopAtStepHook(last_step=last_step)],
                                  save_checkpoint_secs=None, save_checkpoint_steps=save_steps,
                                  save_summaries_steps=None, log_step_count_steps=None,
                                  max_to_keep=1, keep_best=2, best_metric="loss", handle_signals=False,
                                  storage_options=storage_options) as s:
        while not s.should_stop():
            s.run(lambda: _step(model, opt))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    opt.zero_grad()
    loss = -model.weight.sum()
    loss.backward()
    opt.step()
    return {"loss": loss.detach()}


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
