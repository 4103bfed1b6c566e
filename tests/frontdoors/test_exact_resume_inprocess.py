"""Exact resume, in process and fast (SPEC §2; the killed-process version is
tests/integration/test_exact_resume.py; the design is in supervisor/state/resume.py).

A "process" here is: seed every generator, build the objects, open a session on the logdir.
The resumed one must draw, step for step, what the uninterrupted one drew.
"""
from __future__ import annotations

import logging

import pytest
import torch

from hooks import StopAtStepHook
from supervisor import MonitoredTrainingSession
from supervisor.errors import CheckpointError
from supervisor.state.rng import capture_rng_state, restore_rng_state

stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader", exc_type=ImportError, reason="torchdata (the data extra) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata's own noise

EPOCH = 5  # batches per epoch


def make_loader(generator: bool, seed: int = 0):
    torch.manual_seed(seed)  # the loader's sampler seeds itself from the global RNG
    g = torch.Generator().manual_seed(42) if generator else None
    return stateful_dataloader.StatefulDataLoader(torch.arange(20), batch_size=4, shuffle=True, generator=g)


def session(logdir, loader, last_step, **kwargs):
    return MonitoredTrainingSession(str(logdir), state={"data": loader}, hooks=[StopAtStepHook(last_step=last_step)],
                                    save_checkpoint_secs=None, save_checkpoint_steps=None,
                                    save_summaries_steps=None, save_summaries_secs=None,
                                    log_step_count_steps=None, handle_signals=False, **kwargs)


def step(batch):
    """What a step with dropout sees: its batch and its draw from the global RNG."""
    return batch.tolist(), torch.rand(1).item()


def forelse(logdir, loader, last_step, save_at=(), **kwargs):
    """The README's loop; ``save_at``: steps after which to checkpoint (mid-epoch, or an epoch end
    when the step ends an epoch: then the save is the ``else`` branch's, after the StopIteration)."""
    seen = []
    with session(logdir, loader, last_step, **kwargs) as s:
        while not s.should_stop():
            for batch in loader:
                if s.should_stop():
                    break
                seen.append(s.run(step, batch))
                if s.global_step in save_at and s.global_step % EPOCH:
                    s.save_checkpoint(wait=True)
            else:
                if s.global_step in save_at:
                    s.save_checkpoint(wait=True)
    return seen


@pytest.mark.parametrize("generator", [False, True], ids=["shuffle", "generator"])
@pytest.mark.parametrize("capture", [3, 5, 10, 12], ids=lambda n: f"step{n}")
def test_resume_from_mid_epoch_and_epoch_end_draws_what_the_uninterrupted_run_draws(tmp_path, generator, capture):
    reference = forelse(tmp_path / "ref", make_loader(generator), 17)
    forelse(tmp_path / "run", make_loader(generator), capture, save_at=(capture,))
    resumed = forelse(tmp_path / "run", make_loader(generator, seed=1), 17)
    assert resumed == reference[capture:]


def test_rng_drawn_during_creation_does_not_shift_the_resumed_streams(tmp_path):
    """local_init_fn runs at every creation; the uninterrupted run drew there at step 0 only."""
    def local_init_fn(session):
        torch.rand(3)

    reference = forelse(tmp_path / "ref", make_loader(True), 8, local_init_fn=local_init_fn)
    forelse(tmp_path / "run", make_loader(True), 3, save_at=(3,), local_init_fn=local_init_fn)
    resumed = forelse(tmp_path / "run", make_loader(True), 8, local_init_fn=local_init_fn)
    assert resumed == reference[3:]


def test_iterator_created_before_the_session_is_named_in_a_warning(tmp_path, caplog):
    forelse(tmp_path, make_loader(False), 3, save_at=(3,))
    loader = make_loader(False)
    it = iter(loader)  # before the session: it will not see the restored position
    with caplog.at_level(logging.WARNING, logger="supervisor.state.resume"):
        with session(tmp_path, loader, 6) as s:
            s.run(step, next(it))
    (record,) = [r for r in caplog.records if r.name == "supervisor.state.resume"]
    assert record.levelname == "WARNING"
    assert "'data'" in record.getMessage() and "iterator in use" in record.getMessage()


def test_no_warning_for_the_readme_loop(tmp_path, caplog):
    forelse(tmp_path, make_loader(True), 3, save_at=(3,))
    with caplog.at_level(logging.WARNING, logger="supervisor.state.resume"):
        forelse(tmp_path, make_loader(True), 6)
    assert not [r for r in caplog.records if r.name == "supervisor.state.resume"]


def test_checkpoint_without_the_loader_generator_is_named_in_a_warning(tmp_path, caplog, monkeypatch):
    from supervisor.checkpoint import manager

    monkeypatch.setattr(manager, "loader_generators", lambda state: {})  # as an older writer did
    forelse(tmp_path, make_loader(True), 3, save_at=(3,))
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="supervisor.state.resume"):
        forelse(tmp_path, make_loader(True), 4)
    messages = [r.getMessage() for r in caplog.records if r.name == "supervisor.state.resume"]
    assert len(messages) == 1 and "data.generator" in messages[0] and "model.ckpt-3" in messages[0]


def test_named_generators_round_trip_and_a_bad_one_changes_nothing():
    g = torch.Generator().manual_seed(5)
    state = capture_rng_state({"data.generator": g})
    expected = torch.rand(2, generator=g)
    assert restore_rng_state(state, generators={"data.generator": g, "other": torch.Generator()}) == ["other"]
    assert torch.equal(torch.rand(2, generator=g), expected)
    state["generators"]["data.generator"] = torch.zeros(3)  # float: not a generator state
    torch.rand(1)  # away from the saved global state
    current = torch.get_rng_state()
    with pytest.raises(CheckpointError, match="data.generator"):
        restore_rng_state(state, where="ckpt-9", generators={"data.generator": g})
    assert torch.equal(torch.get_rng_state(), current)  # validated before anything was set


def test_recovery_inside_the_loop_is_named_in_a_warning(tmp_path, caplog):
    """A recovery restores the loader, but the for loop keeps the iterator it holds."""
    from supervisor.errors import RecoverableError
    from supervisor.testing import FakeClock

    loader = make_loader(False)
    failures = []

    def fails_once(batch):
        if not failures:
            failures.append(batch)
            raise RecoverableError("transient")
        return step(batch)

    with caplog.at_level(logging.WARNING, logger="supervisor.state.resume"):
        with session(tmp_path, loader, 6, clock=FakeClock()) as s:
            for batch in loader:
                if s.should_stop():
                    break
                if s.global_step == 3:
                    s.save_checkpoint(wait=True)
                s.run(fails_once if s.global_step == 3 else step, batch)
    assert failures
    messages = [r.getMessage() for r in caplog.records if r.name == "supervisor.state.resume"]
    assert len(messages) == 1 and "'data'" in messages[0] and "recovering inside the loop" in messages[0]
