"""SPEC §10.2's epochs rule (issue 22 item 8): a re-iterable training input is iterated again
until max_steps, a DistributedSampler gets set_epoch, the epoch and position are checkpointed
so a resume continues mid-epoch exactly, and a one-shot iterator that runs out says so."""
from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from supervisor.estimator import EvalSpec, TrainSpec, train_and_evaluate
from tests.estimator.estimator_toy import X, Y, batches, make_estimator

pytestmark = pytest.mark.timeout(120)


def loader(**kwargs):
    return DataLoader(TensorDataset(X, Y), batch_size=16, **kwargs)  # 6 batches per epoch


def recording_estimator(model_dir, seen, **overrides):
    est = make_estimator(model_dir, **overrides)
    train_step = est._train_step

    def recording_step(batch):
        seen.append(batch[0].sum().item())
        return train_step(batch)

    est._train_step = recording_step
    return est


@pytest.mark.parametrize("make_input", [lambda: loader(shuffle=True), lambda: list(batches())],
                         ids=["dataloader", "list"])
def test_train_and_evaluate_iterates_a_reiterable_until_max_steps(tmp_path, make_input):
    seen = []
    est = recording_estimator(tmp_path, seen)
    data = make_input()
    metrics, _ = train_and_evaluate(est, TrainSpec(lambda: data, max_steps=20),
                                    EvalSpec(lambda: batches(), steps=2, throttle_secs=0))
    assert len(seen) == 20 and est.checkpoint_step() == 20 and metrics["global_step"] == 20


def test_estimator_train_iterates_a_dataloader_until_max_steps_and_steps(tmp_path):
    seen = []
    est = recording_estimator(tmp_path, seen)
    est.train(lambda: loader(shuffle=True), max_steps=15)
    assert est.checkpoint_step() == 15
    est.train(lambda: loader(shuffle=True), steps=8)
    assert est.checkpoint_step() == 23 and len(seen) == 23


def test_without_a_step_limit_a_reiterable_is_one_epoch(tmp_path):
    seen = []
    recording_estimator(tmp_path, seen).train(lambda: loader())
    assert len(seen) == 6


class RecordingSampler(DistributedSampler):
    epochs: list[int] = []

    def set_epoch(self, epoch):
        RecordingSampler.epochs.append(epoch)
        super().set_epoch(epoch)


def test_distributed_sampler_gets_set_epoch_each_pass(tmp_path):
    RecordingSampler.epochs = []
    sampler = RecordingSampler(TensorDataset(X, Y), num_replicas=1, rank=0, shuffle=True, seed=3)
    data = DataLoader(TensorDataset(X, Y), batch_size=16, sampler=sampler)
    seen = []
    recording_estimator(tmp_path, seen).train(lambda: data, max_steps=20)
    assert RecordingSampler.epochs == [0, 1, 2, 3] and len(seen) == 20
    assert seen[:6] != seen[6:12]  # reshuffled per epoch (seed + epoch)


def run_to(model_dir, max_steps, seen, *, seed_after_build=None):
    est = recording_estimator(model_dir, seen)
    if seed_after_build is not None:
        torch.manual_seed(seed_after_build)  # a new process's RNG: the checkpoint restores it
    data = loader(shuffle=True)
    train_and_evaluate(est, TrainSpec(lambda: data, max_steps=max_steps),
                       EvalSpec(lambda: batches(shuffle=True), steps=2, throttle_secs=0))
    return {k: v.clone() for k, v in est.model.state_dict().items()}


def test_resume_continues_mid_epoch_bit_exact(tmp_path):
    uninterrupted_seen, first_seen, resumed_seen = [], [], []
    uninterrupted = run_to(tmp_path / "a", 20, uninterrupted_seen)
    run_to(tmp_path / "b", 8, first_seen)  # stops in epoch 1 at batch 2 (6 batches per epoch)
    resumed = run_to(tmp_path / "b", 20, resumed_seen, seed_after_build=99)
    assert first_seen + resumed_seen == uninterrupted_seen
    assert all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)


def test_one_shot_iterator_running_out_warns_with_the_step_and_max_steps(tmp_path, caplog):
    est = make_estimator(tmp_path)
    with caplog.at_level(logging.INFO):
        train_and_evaluate(est, TrainSpec(lambda: batches(), max_steps=50),
                           EvalSpec(lambda: batches(), steps=None, throttle_secs=0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step 6" in w and "max_steps=50" in w for w in warnings), warnings
    assert est.checkpoint_step() == 6


def test_evaluation_logs_do_not_read_like_training_stopping(tmp_path, caplog):
    est = make_estimator(tmp_path)
    with caplog.at_level(logging.INFO):
        train_and_evaluate(est, TrainSpec(lambda: list(batches()), max_steps=10),
                           EvalSpec(lambda: batches(), steps=None, throttle_secs=0))
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "data exhausted" in line or "restored step=" in line], lines
    # the training session's stop, once; none from the evaluation sessions (steps 5 and 10)
    assert [line for line in lines if "stopping at step" in line] == [
        "stopping at step 10: StopAtStepHook requested stop at step 10"]


def test_a_checkpoint_without_the_input_position_still_resumes(tmp_path):
    from supervisor.estimator.inputs import INPUT_ENTRY
    from supervisor.estimator.variables import variable_names

    old = make_estimator(tmp_path)
    old.train(lambda: batches(), max_steps=5)  # a generator: no position entry, as older versions
    assert not any(n.startswith(INPUT_ENTRY) for n in variable_names(old.latest_checkpoint()))
    new = make_estimator(tmp_path)
    new.train(lambda: loader(), max_steps=12)
    assert new.checkpoint_step() == 12
    assert not any(n.startswith(INPUT_ENTRY) for n in variable_names(new.latest_checkpoint()))


def test_state_entry_named_like_the_input_position_is_refused(tmp_path):
    est = make_estimator(tmp_path, state={"input_position": torch.optim.SGD([torch.zeros(1)], lr=1)})
    with pytest.raises(ValueError, match="input_position"):
        est.train(lambda: loader(), max_steps=2)



def test_consecutive_train_calls_on_one_loader_go_on_without_a_fast_forward(tmp_path):
    fetched = []

    class CountingList(list):
        def __iter__(self):
            for batch in super().__iter__():
                fetched.append(1)
                yield batch

    seen = []
    est = recording_estimator(tmp_path, seen)
    data = CountingList(batches())
    for _ in range(4):
        est.train(lambda: data, steps=4)
    assert len(seen) == 16 and est.checkpoint_step() == 16
    assert len(fetched) == 16  # each batch drawn once: no pass re-created and skipped through
    assert seen == [b[0].sum().item() for b in list(batches()) * 3][:16]
