"""The README's StatefulDataLoader pattern: a run stopped mid-epoch and resumed sees exactly
the batches an uninterrupted run sees (SPEC §2, data position)."""
from __future__ import annotations

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import Supervisor

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader", exc_type=ImportError, reason="torchdata (the data extra) is not installed")


def train(logdir, last_step, seen):
    torch.manual_seed(0)
    dataset = torch.arange(40.0).unsqueeze(1)
    loader = stateful_dataloader.StatefulDataLoader(dataset, batch_size=4, shuffle=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)

    def train_step(batch):
        seen.append(batch.flatten().tolist())
        opt.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        opt.step()
        return {"loss": loss.detach()}

    sv = Supervisor(logdir, model=model, optimizer=opt, state={"data": loader},
                    hooks=[StopAtStepHook(last_step=last_step)], handle_signals=False)
    with sv.managed_session() as s:
        while not s.should_stop():
            for batch in loader:
                if s.should_stop():  # the batch just fetched is never trained: the final
                    break            # checkpoint was taken at the stopping step's boundary
                s.run(train_step, batch)
            else:
                s.save_checkpoint()
    return model.weight.detach().clone()


def test_resumed_run_sees_the_same_batches(tmp_path):
    reference = []
    ref_weight = train(tmp_path / "ref", 25, reference)  # 2.5 epochs of 10 batches
    resumed = []
    train(tmp_path / "run", 13, resumed)  # stops mid-epoch 2
    weight = train(tmp_path / "run", 25, resumed)
    assert resumed == reference
    assert torch.equal(weight, ref_weight)
